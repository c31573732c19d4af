"""The read side (``Capability.INSPECT``): lists with filters and paging,
counts by state, queue and name, workers."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

import pytest

from conveyor.backends import Backend
from conveyor.backends.capabilities import Inspector, capability_of
from conveyor.backends.params import ClaimParams, Completion, ErrorInfo, FinishParams
from conveyor.backends.protocol import Capability
from conveyor.errors import ConfigurationError
from conveyor.model import Attempt, Outcome, Task, TaskState
from conveyor.records import (
    SUMMARY_ERROR_CHARS,
    ActivityBucket,
    LastError,
    QueueBacklog,
    TaskCount,
    TaskFilter,
    TaskSummary,
)
from tests.conformance.test_tasks import T0, claim, enqueue, later, new, success


def _inspector(backend: Backend) -> Inspector:
    found = capability_of(backend, Capability.INSPECT)
    assert found is not None, "every backend reads for the CLI and dashboards"
    return found


async def test_lists_page_newest_first_with_filters(backend: Backend) -> None:
    inspector = _inspector(backend)
    ids = await enqueue(backend, *(new(payload={"n": n}) for n in range(7)))
    mail = await enqueue(backend, new(queue="mail"), new(name="other", queue="mail"))
    [claimed] = await claim(backend, limit=1)  # the first due by claim order
    newest_first = sorted(ids + mail, reverse=True)

    pages: list[list[int]] = []
    before = None
    while True:
        page = await inspector.list_tasks(TaskFilter(limit=4, before=before))
        if not page:
            break
        pages.append([t.id for t in page])
        before = page[-1].id
    assert pages == [newest_first[:4], newest_first[4:8], newest_first[8:]]

    in_mail = await inspector.list_tasks(TaskFilter(queue="mail"))
    assert [t.id for t in in_mail] == sorted(mail, reverse=True)
    others = await inspector.list_tasks(TaskFilter(name="other"))
    assert [t.id for t in others] == [mail[1]]
    running = await inspector.list_tasks(TaskFilter(state=TaskState.IN_PROGRESS))
    assert [t.id for t in running] == [claimed.token.task_id]
    paged = await inspector.list_tasks(TaskFilter(queue="default", before=ids[3], limit=2))
    assert [t.id for t in paged] == [ids[2], ids[1]]


async def test_a_parent_s_children_are_listed_with_the_other_filters(backend: Backend) -> None:
    inspector = _inspector(backend)
    [parent, other] = await enqueue(backend, new(), new())
    children = await enqueue(
        backend,
        *(replace(new(payload={"n": n}), parent_id=parent) for n in range(5)),
        replace(new(name="other"), parent_id=parent),
        replace(new(), parent_id=other),
    )
    mine = children[:6]
    listed = await inspector.list_tasks(TaskFilter(parent=parent))
    assert [t.id for t in listed] == sorted(mine, reverse=True)
    assert all(t.parent_id == parent for t in listed)
    named = await inspector.list_tasks(TaskFilter(parent=parent, name="other"))
    assert [t.id for t in named] == [children[5]]
    paged = await inspector.list_tasks(TaskFilter(parent=parent, before=mine[3], limit=2))
    assert [t.id for t in paged] == [mine[2], mine[1]]
    [claimed] = await claim(backend, limit=1)  # the parent itself: first by claim order
    assert claimed.token.task_id == parent
    assert await inspector.list_tasks(TaskFilter(parent=parent, state=TaskState.IN_PROGRESS)) == []
    assert len(await inspector.list_tasks(TaskFilter(parent=parent, state=TaskState.PENDING))) == 6
    assert await inspector.list_tasks(TaskFilter(parent=children[0])) == []


async def test_counts_by_state_queue_and_name(backend: Backend) -> None:
    inspector = _inspector(backend)
    assert await inspector.count_tasks() == []
    await enqueue(backend, new(), new(), new(queue="mail"), new(name="other", queue="mail"))
    await claim(backend, limit=1)
    assert await inspector.count_tasks() == [
        TaskCount(TaskState.IN_PROGRESS, "default", "job", 1),
        TaskCount(TaskState.PENDING, "default", "job", 1),
        TaskCount(TaskState.PENDING, "mail", "job", 1),
        TaskCount(TaskState.PENDING, "mail", "other", 1),
    ]


@pytest.mark.parametrize(
    "bad",
    [
        {"limit": -1},
        {"limit": "10"},
        {"limit": True},
        {"before": "7"},
        {"before": 1.5},
        {"parent": "3"},
        {"parent": False},
    ],
)
def test_a_bad_filter_is_refused_before_any_io(bad: dict[str, object]) -> None:
    with pytest.raises(ConfigurationError):
        TaskFilter(**bad)  # type: ignore[arg-type]


async def test_queue_backlogs_split_due_from_later_with_the_oldest_due(backend: Backend) -> None:
    inspector = _inspector(backend)
    assert await inspector.queue_backlogs(now=T0) == []
    ids = await enqueue(
        backend,
        new(run_at=later(-30)),
        new(run_at=later(-5)),
        new(run_at=later(60)),
        new(queue="mail", run_at=later(-1)),
        new(queue="night", run_at=later(3600)),
        new(run_at=later(-60), priority=9),  # claimed below: no longer pending
    )
    [claimed] = await claim(backend, limit=1)
    assert claimed.token.task_id == ids[-1]  # the priority 9 one: no longer pending
    found = await inspector.queue_backlogs(now=T0)
    assert found == [
        QueueBacklog("default", 2, 1, later(-30)),
        QueueBacklog("mail", 1, 0, later(-1)),
        QueueBacklog("night", 0, 1, None),
    ]
    # Without a given now, the store's clock (today: T0 is years ahead).
    assert [(b.queue, b.due) for b in await inspector.queue_backlogs()] == [
        ("default", 0),
        ("mail", 0),
        ("night", 0),
    ]


async def test_activity_counts_finished_tasks_by_bucket_and_state(backend: Backend) -> None:
    inspector = _inspector(backend)
    assert await inspector.activity(T0, 60) == []
    ids = await enqueue(backend, *(new(max_attempts=1) for _ in range(6)))
    taken = await backend.claim(  # a lease that lasts past every finish below
        ClaimParams(worker_id="w1", names=["job"], queues=["default"], limit=6, lease=600, now=T0)
    )
    claimed = {c.token.task_id: c.token for c in taken}
    ok = [ids[0], ids[1], ids[2], ids[3]]
    ends = [later(10), later(59.999), later(60), later(130)]
    for task_id, at in zip(ok, ends, strict=True):
        done = Completion(claimed[task_id], Outcome.SUCCEEDED, TaskState.SUCCEEDED, result="1")
        assert (await backend.finish(FinishParams("w1", [done], now=at))).applied
    failed = Completion(
        claimed[ids[4]], Outcome.FAILED, TaskState.FAILED, error=ErrorInfo("E", "m")
    )
    assert (await backend.finish(FinishParams("w1", [failed], now=later(70)))).applied
    await backend.cancel(ids[5], now=later(80))  # a cancel (of a running task) is not counted
    [left] = await enqueue(backend, new())  # nor is a pending task

    assert await inspector.activity(T0, 60) == [
        ActivityBucket(T0, 2, 0),
        ActivityBucket(later(60), 1, 1),
        ActivityBucket(later(120), 1, 0),
    ]
    assert await inspector.activity(later(30), 60) == [
        ActivityBucket(later(30), 2, 1),
        ActivityBucket(later(90), 1, 0),
    ]
    assert await inspector.activity(later(131), 60) == []
    assert await inspector.activity(T0, 3600) == [ActivityBucket(T0, 4, 1)]
    assert await inspector.activity(later(-3600), 1) == [  # many buckets, most of them empty
        ActivityBucket(later(10), 1, 0),
        ActivityBucket(later(59), 1, 0),
        ActivityBucket(later(60), 1, 0),
        ActivityBucket(later(70), 0, 1),
        ActivityBucket(later(130), 1, 0),
    ]
    await backend.retry(ids[4], now=later(140))  # a failed task retried no longer counts
    assert await inspector.activity(later(60), 60) == [
        ActivityBucket(later(60), 1, 0),
        ActivityBucket(later(120), 1, 0),
    ]
    assert left not in ids


@pytest.mark.parametrize("bucket", [0, -5, 1.5, True])
async def test_activity_refuses_a_bad_bucket(backend: Backend, bucket: object) -> None:
    with pytest.raises(ConfigurationError):
        await _inspector(backend).activity(T0, bucket)  # type: ignore[arg-type]


def _listed_as_summary(task: Task, last: Attempt | None) -> TaskSummary:
    """What a summary of ``task`` holds, by the rule of :class:`TaskSummary`,
    ``last`` its latest attempt (read with its log)."""
    ended = task.state not in (TaskState.IN_PROGRESS, TaskState.SUCCEEDED)
    failed = last is not None and last.outcome not in (Outcome.SUCCEEDED, Outcome.IN_PROGRESS)
    return TaskSummary(
        id=task.id,
        name=task.name,
        queue=task.queue,
        state=task.state,
        priority=task.priority,
        run_at=task.run_at,
        attempt=task.attempt,
        max_attempts=task.max_attempts,
        created_at=task.created_at,
        finished_at=task.finished_at,
        worker_id=task.worker_id if task.state is TaskState.IN_PROGRESS else None,
        cancel_requested=task.cancel_requested,
        step=task.step,
        last_error=LastError(
            last.outcome,
            None if last.error_type is None else last.error_type[:SUMMARY_ERROR_CHARS],
            None if last.error_message is None else last.error_message[:SUMMARY_ERROR_CHARS],
        )
        if ended and failed and last is not None
        else None,
    )


async def _assert_summaries_list_the_same(backend: Backend, task_filter: TaskFilter) -> None:
    inspector = _inspector(backend)
    listed = await inspector.list_tasks(task_filter)
    expected = []
    for task in listed:
        full = await backend.get_task(task.id)
        assert full is not None
        expected.append(_listed_as_summary(task, full.last_attempt))
    assert await inspector.list_summaries(task_filter) == expected, task_filter


async def _finish(backend: Backend, done: Completion, at: datetime) -> None:
    assert (await backend.finish(FinishParams(done.token.worker_id, [done], now=at))).applied


async def test_summaries_are_the_listed_tasks_without_payloads(backend: Backend) -> None:
    """Most states, a step, a cancel request, errors long and short, a lost
    lease, a task running again after a failure: each filter and page gives
    the tasks list_tasks gives, in its order, with the same columns and each
    one's latest failed attempt."""
    huge = {"blob": "x" * 5000}
    ids = await enqueue(
        backend,
        new(payload=huge, max_attempts=1),  # fails with a long error
        new(payload=huge, max_attempts=2),  # fails, then waits for its retry
        new(payload=huge, max_attempts=2),  # fails, then succeeds
        new(payload=huge),  # succeeds at once
        new(payload=huge, max_attempts=1),  # runs, its lease lost: failed
        new(payload=huge),  # runs, cancel requested
        new(payload=huge),  # runs
        replace(new(name="other", queue="mail", priority=5), step="first"),
        new(queue="mail"),  # cancelled before it ran
        new(run_at=later(3600)),  # pending, never run
    )
    taken = await backend.claim(
        ClaimParams(worker_id="w1", names=["job"], queues=["default"], limit=7, lease=60, now=T0)
    )
    token = {c.token.task_id: c.token for c in taken}
    assert set(token) == set(ids[:7])
    long_error = ErrorInfo("Boom" * 200, "why " * 1000, "Traceback ...")
    await _finish(
        backend,
        Completion(token[ids[0]], Outcome.FAILED, TaskState.FAILED, error=long_error),
        later(1),
    )
    short = ErrorInfo("ValueError", "bad card")
    for retried in (ids[1], ids[2]):
        retry = Completion(
            token[retried], Outcome.FAILED, TaskState.PENDING, error=short, retry_delay=5
        )
        await _finish(backend, retry, later(2))
    await _finish(backend, success(token[ids[3]]), later(3))
    await backend.cancel(ids[5], now=later(4))
    await backend.cancel(ids[8], now=later(4))
    again = await backend.claim(
        ClaimParams(
            worker_id="w2", names=["job"], queues=["default"], limit=2, lease=600, now=later(7)
        )
    )
    assert [c.token.task_id for c in again] == [ids[1], ids[2]]
    await _finish(backend, success(again[1].token), later(8))  # ids[1] runs on
    # The leases of w1 expire: the next claim ends ids[4] (its budget spent)
    # and takes ids[6] again.
    reclaimed = await backend.claim(
        ClaimParams(
            worker_id="w3", names=["job"], queues=["default"], limit=10, lease=600, now=later(61)
        )
    )
    assert ids[6] in {c.token.task_id for c in reclaimed}

    states = {t.id: t.state for t in await _inspector(backend).list_tasks(TaskFilter())}
    assert states[ids[0]] is TaskState.FAILED and states[ids[4]] is TaskState.FAILED
    assert states[ids[2]] is TaskState.SUCCEEDED and states[ids[8]] is TaskState.CANCELLED

    filters = [
        TaskFilter(),
        TaskFilter(limit=3),
        TaskFilter(limit=0),
        TaskFilter(limit=4, before=ids[7]),
        TaskFilter(name="other"),
        TaskFilter(queue="mail"),
        TaskFilter(queue="default", before=ids[5], limit=2),
        *(TaskFilter(state=state) for state in TaskState),
        TaskFilter(state=TaskState.FAILED, before=ids[4]),
        TaskFilter(state=TaskState.PENDING, queue="mail"),
    ]
    for task_filter in filters:
        await _assert_summaries_list_the_same(backend, task_filter)

    summaries = {s.id: s for s in await _inspector(backend).list_summaries(TaskFilter())}
    cut = summaries[ids[0]].last_error
    assert cut is not None and cut.outcome is Outcome.FAILED
    assert cut.error_type == long_error.type[:SUMMARY_ERROR_CHARS]
    assert cut.error_message == long_error.message[:SUMMARY_ERROR_CHARS]
    assert summaries[ids[4]].last_error is not None
    assert summaries[ids[4]].last_error.outcome is Outcome.LEASE_LOST
    assert summaries[ids[2]].last_error is None  # it succeeded since
    assert summaries[ids[9]].last_error is None  # never run
    assert summaries[ids[7]].step == "first"


async def test_a_parent_s_children_are_summarized_as_listed(backend: Backend) -> None:
    [parent, other] = await enqueue(backend, new(), new())
    children = await enqueue(
        backend,
        *(replace(new(payload={"n": n}), parent_id=parent) for n in range(5)),
        replace(new(name="other"), parent_id=parent),
        replace(new(), parent_id=other),
    )
    await claim(backend, limit=1)  # the parent itself, first by claim order
    for task_filter in (
        TaskFilter(parent=parent),
        TaskFilter(parent=parent, name="other"),
        TaskFilter(parent=parent, before=children[3], limit=2),
        TaskFilter(parent=parent, state=TaskState.PENDING),
        TaskFilter(parent=parent, state=TaskState.IN_PROGRESS),
        TaskFilter(parent=children[0]),
    ):
        await _assert_summaries_list_the_same(backend, task_filter)
    assert [s.id for s in await _inspector(backend).list_summaries(TaskFilter(parent=other))] == [
        children[6]
    ]


async def test_running_tasks_are_counted_by_worker(backend: Backend) -> None:
    inspector = _inspector(backend)
    assert await inspector.running_by_worker() == {}
    ids = await enqueue(backend, *(new() for _ in range(6)))
    first = await claim(backend, "w1", limit=3)
    await claim(backend, "w2", limit=2)
    assert await inspector.running_by_worker() == {"w1": 3, "w2": 2}
    await _finish(backend, success(first[0].token), later(1))
    assert await inspector.running_by_worker() == {"w1": 2, "w2": 2}
    await backend.cancel(ids[5], now=later(2))  # pending: nothing changes for workers
    assert await inspector.running_by_worker() == {"w1": 2, "w2": 2}
