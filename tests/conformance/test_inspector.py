"""The read side (``Capability.INSPECT``): lists with filters and paging,
counts by state, queue and name, workers."""

from __future__ import annotations

from dataclasses import replace

import pytest

from conveyor.backends import Backend
from conveyor.backends.protocol import (
    ActivityBucket,
    ClaimParams,
    Completion,
    ErrorInfo,
    FinishParams,
    Inspector,
    QueueBacklog,
    TaskCount,
    TaskFilter,
    inspector_of,
)
from conveyor.errors import ConfigurationError
from conveyor.model import Outcome, TaskState
from tests.conformance.test_tasks import T0, claim, enqueue, later, new


def _inspector(backend: Backend) -> Inspector:
    found = inspector_of(backend)
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
