"""Dependencies at the backend level, on every backend: a task enqueued
with ``after`` is stored waiting and becomes pending when the last of its
dependencies has ended as its policy asks, whatever ended them (a worker,
a cancel, a bulk cancel, a spent crash budget); a failed or cancelled
dependency ends it by its policy, and that end moves its own dependents;
dependencies already ended when it is stored count at once; each edge is
settled once; the outcomes read back in order; a task that an unfinished
dependent waits for is neither deleted nor pruned."""

from __future__ import annotations

from dataclasses import replace

import pytest

from conveyor.backends.params import (
    Completion,
    EnqueueParams,
    ErrorInfo,
    FinishParams,
    NewTask,
    WorkFilter,
    earlier,
)
from conveyor.backends.protocol import Backend
from conveyor.errors import ConfigurationError, InvalidTransitionError, TaskNotFoundError
from conveyor.model import LeaseToken, Outcome, TaskState
from conveyor.records import CancelMany, DeleteMany, PruneParams
from tests.conformance.test_tasks import LEASE, T0, claim, enqueue, later, new, success

S = TaskState


def after(*dependencies: int, policy: str = "cancel", **fields: object) -> NewTask:
    return replace(new(**fields), after=dependencies, after_policy=policy)  # type: ignore[arg-type]


async def state(backend: Backend, task_id: int) -> tuple[TaskState, int | None]:
    task = await backend.get_task(task_id, with_attempts=False)
    assert task is not None
    return task.state, task.waiting_for


HELD: dict[int, dict[int, LeaseToken]] = {}
"""The leases ``run`` took, by backend, so that a later call can end a task
an earlier one claimed."""


async def run(backend: Backend, *outcomes: tuple[int, str], at: float = 1) -> None:
    """Claim every due task at ``at`` and end those named: ``ok`` succeeds
    (result: its id), ``fail`` fails for good; the others are left running."""
    claimed = HELD.setdefault(id(backend), {})
    claimed.update({t.token.task_id: t.token for t in await claim(backend, limit=50, at=later(at))})
    completions = []
    for task_id, how in outcomes:
        token = claimed[task_id]
        if how == "ok":
            completions.append(success(token, {"id": task_id}))
        else:
            completions.append(
                Completion(
                    token,
                    Outcome.FAILED,
                    TaskState.FAILED,
                    error=ErrorInfo("ValueError", f"task {task_id} broke"),
                )
            )
    result = await backend.finish(FinishParams("w1", completions, now=later(at)))
    assert len(result.applied) == len(completions)


async def due_ids(backend: Backend, at: float) -> set[int]:
    claimed = await claim(backend, "peek", limit=50, at=later(at))
    return {t.token.task_id for t in claimed}


async def test_a_dependent_waits_until_every_dependency_succeeded(backend: Backend) -> None:
    [a, b] = await enqueue(backend, new(), new())
    [d] = await enqueue(backend, after(a, b))
    assert await state(backend, d) == (S.WAITING, 2)
    await run(backend, (a, "ok"))
    assert await state(backend, d) == (S.WAITING, 1)
    assert await backend.count_unfinished(WorkFilter(("job",), ("default",), now=later(1))) == 1
    await run(backend, (b, "ok"), at=2)  # b was claimed at 1 already: its lease is live
    assert await state(backend, d) == (S.PENDING, 0)
    task = await backend.get_task(d, with_attempts=False)
    assert task is not None and task.run_at == later(2)  # due when released, not before
    assert await due_ids(backend, 2) == {d}


async def test_a_dependent_s_own_later_run_at_holds(backend: Backend) -> None:
    [a] = await enqueue(backend, new())
    [d] = await enqueue(backend, replace(after(a), run_at=later(60)))
    await run(backend, (a, "ok"))
    task = await backend.get_task(d, with_attempts=False)
    assert task is not None and (task.state, task.run_at) == (S.PENDING, later(60))
    assert await due_ids(backend, 30) == set()
    assert await due_ids(backend, 61) == {d}


async def test_a_chain_in_one_enqueue_runs_link_by_link(backend: Backend) -> None:
    ids = await enqueue(backend, new(), after(earlier(0)), after(earlier(1)))
    first, second, third = ids
    assert ids == sorted(ids)
    assert [await state(backend, i) for i in ids] == [
        (S.PENDING, None),
        (S.WAITING, 1),
        (S.WAITING, 1),
    ]
    await run(backend, (first, "ok"))
    assert await state(backend, second) == (S.PENDING, 0)
    assert await state(backend, third) == (S.WAITING, 1)
    await run(backend, (second, "ok"), at=2)
    assert await state(backend, third) == (S.PENDING, 0)


@pytest.mark.parametrize(
    ("policy", "ends"), [("cancel", S.CANCELLED), ("fail", S.FAILED), ("run", S.PENDING)]
)
async def test_a_failed_dependency_moves_its_dependent_by_policy(
    backend: Backend, policy: str, ends: TaskState
) -> None:
    [a, b] = await enqueue(backend, new(max_attempts=1), new())
    [d] = await enqueue(backend, after(a, b, policy=policy))
    await run(backend, (a, "fail"), (b, "ok"))
    found, _ = await state(backend, d)
    assert found is ends
    task = await backend.get_task(d, with_attempts=False)
    assert task is not None
    assert (task.finished_at is not None) is ends.is_terminal


async def test_an_end_by_policy_moves_the_dependent_s_own_dependents(backend: Backend) -> None:
    [a] = await enqueue(backend, new(max_attempts=1))
    [b, c, e] = await enqueue(
        backend,
        after(a),  # cancelled when a fails
        after(earlier(0), policy="fail"),  # failed when b is cancelled
        after(earlier(1), policy="run"),  # runs anyway once c ended
    )
    await run(backend, (a, "fail"))
    assert [(await state(backend, i))[0] for i in (b, c, e)] == [S.CANCELLED, S.FAILED, S.PENDING]


async def test_ended_dependencies_count_when_the_dependent_is_stored(backend: Backend) -> None:
    [ok, bad] = await enqueue(backend, new(), new(max_attempts=1))
    await run(backend, (ok, "ok"), (bad, "fail"))
    [waits, runs, cancelled, failed] = await enqueue(
        backend,
        after(ok, new_id := (await enqueue(backend, new()))[0]),
        after(ok),
        after(ok, bad),
        after(bad, policy="fail"),
    )
    assert await state(backend, waits) == (S.WAITING, 1)
    assert await state(backend, runs) == (S.PENDING, 0)
    assert (await state(backend, cancelled))[0] is S.CANCELLED
    assert (await state(backend, failed))[0] is S.FAILED
    [also] = await enqueue(backend, after(ok, bad, policy="run"))
    assert await state(backend, also) == (S.PENDING, 0)
    assert new_id > bad


async def test_an_unknown_dependency_stores_nothing(backend: Backend) -> None:
    [a] = await enqueue(backend, new())
    with pytest.raises(TaskNotFoundError):
        await enqueue(backend, new(), after(a), after(a + 1000))
    assert await backend.count_unfinished(WorkFilter(("job",), ("default",), now=later(1))) == 1


@pytest.mark.parametrize("reference", [earlier(1), earlier(5), 0])
async def test_a_dependency_that_could_make_a_cycle_is_refused_before_any_io(
    backend: Backend, reference: int
) -> None:
    with pytest.raises(ConfigurationError, match="no cycles"):
        await enqueue(backend, new(), after(reference))
    assert await backend.count_unfinished(WorkFilter(("job",), ("default",), now=later(1))) == 0


async def test_an_unknown_policy_is_refused(backend: Backend) -> None:
    [a] = await enqueue(backend, new())
    with pytest.raises(ConfigurationError, match="after_policy"):
        await enqueue(backend, after(a, policy="ignore"))


async def test_a_bulk_cancel_cancels_a_dependent_its_batch_released(backend: Backend) -> None:
    """A dependent under ``run`` that a cancel of its last dependency makes
    pending, in the same batch that selected it waiting, is cancelled as it
    is then; and one that cancel ended by its policy is cancelled too."""
    [a, b] = await enqueue(backend, new(), new())
    [runs, ends] = await enqueue(backend, after(a, policy="run"), after(b))
    done = await backend.cancel_many(CancelMany(ids=[a, b, runs, ends], now=later(1)))
    assert [(await state(backend, i))[0] for i in (a, b, runs, ends)] == [S.CANCELLED] * 4
    assert {a, b, runs} <= set(done) <= {a, b, runs, ends}


async def test_every_way_a_dependency_ends_settles_it(backend: Backend) -> None:
    [cancelled, bulk, crashed, worker_cancelled] = await enqueue(
        backend, new(), new(), new(max_attempts=1), new()
    )
    dependents = await enqueue(
        backend, *(after(i, policy="run") for i in (cancelled, bulk, crashed, worker_cancelled))
    )
    assert await backend.cancel(cancelled, now=later(1)) is S.CANCELLED
    await backend.cancel_many(CancelMany(ids=[bulk], states=(S.PENDING,), now=later(1)))
    claimed = {t.token.task_id: t.token for t in await claim(backend, limit=10, at=later(2))}
    assert set(claimed) == {crashed, worker_cancelled, dependents[0], dependents[1]}
    stopped = Completion(claimed[worker_cancelled], Outcome.CANCELLED, TaskState.CANCELLED)
    assert (await backend.finish(FinishParams("w1", [stopped], now=later(3)))).applied
    # The crash budget of `crashed` is spent: its end releases its dependent,
    # which this claim hands out.
    await claim(backend, "w2", at=later(LEASE + 5))
    assert (await state(backend, crashed))[0] is S.FAILED
    await claim(backend, "w3", at=later(LEASE + 6))
    released = [await state(backend, d) for d in dependents[2:]]
    assert released == [(S.IN_PROGRESS, 0)] * 2


async def test_an_edge_is_settled_once(backend: Backend) -> None:
    [a, b] = await enqueue(backend, new(max_attempts=1), new())
    [d] = await enqueue(backend, after(a, b, policy="run"))
    await run(backend, (a, "fail"))
    assert await state(backend, d) == (S.WAITING, 1)
    assert await backend.retry(a, now=later(2)) is S.PENDING
    await run(backend, (a, "fail"), at=3)  # a ends again: d does not count it again
    assert await state(backend, d) == (S.WAITING, 1)
    records = await backend.dependencies(d)
    assert [(r.task_id, r.settled) for r in records] == [(a, True), (b, False)]


async def test_a_dependent_cancelled_by_hand_is_left_alone_by_later_ends(
    backend: Backend,
) -> None:
    [a] = await enqueue(backend, new())
    [d] = await enqueue(backend, after(a))
    assert await backend.cancel(d, now=later(1)) is S.CANCELLED
    await run(backend, (a, "ok"), at=2)
    assert (await state(backend, d))[0] is S.CANCELLED
    assert await backend.retry(d, now=later(3)) is S.PENDING  # it then runs as any task
    assert await due_ids(backend, 3) == {d}


async def test_the_dependencies_read_back_in_order_with_their_outcomes(backend: Backend) -> None:
    [a, b, c] = await enqueue(backend, new(), new(max_attempts=1), new(run_at=later(100)))
    [d] = await enqueue(backend, after(c, a, b, policy="run"))
    await run(backend, (a, "ok"), (b, "fail"))
    records = await backend.dependencies(d)
    assert [(r.task_id, r.name, r.state, r.settled) for r in records] == [
        (c, "job", S.PENDING, False),
        (a, "job", S.SUCCEEDED, True),
        (b, "job", S.FAILED, True),
    ]
    assert [r.result for r in records] == [None, {"id": a}, None]
    assert [(r.error_type, r.error_message) for r in records] == [
        (None, None),
        (None, None),
        ("ValueError", f"task {b} broke"),
    ]
    assert await backend.dependencies(a) == []
    assert await backend.dependencies(d + 1000) == []


async def test_receives_comes_back_with_the_claim(backend: Backend) -> None:
    [a] = await enqueue(backend, new())
    [d, plain] = await enqueue(backend, replace(after(a), receives="result:value"), new())
    await run(backend, (a, "ok"), (plain, "ok"))
    [claimed] = await claim(backend, at=later(2))
    assert (claimed.token.task_id, claimed.receives) == (d, "result:value")


async def test_a_task_an_unfinished_dependent_waits_for_is_kept(backend: Backend) -> None:
    [a, b] = await enqueue(backend, new(), new(run_at=later(100)))
    [d] = await enqueue(backend, after(a, b))
    await run(backend, (a, "ok"))
    with pytest.raises(InvalidTransitionError, match="depends on it"):
        await backend.delete(a)
    with pytest.raises(InvalidTransitionError, match="depends on it"):
        await backend.delete(b)
    deleted = await backend.delete_many(DeleteMany(ids=[a], states=(S.SUCCEEDED,)))
    assert deleted == []
    prune = PruneParams(before={S.SUCCEEDED: later(100)}, limit=100)
    assert (await backend.prune(prune)).tasks == 0
    await backend.cancel(d, now=later(2))
    await backend.delete(a)  # nothing waits for it now
    assert await backend.get_task(a) is None
    assert [r.state for r in await backend.dependencies(d)] == [None, S.PENDING]


async def test_a_repeated_idempotency_key_stores_no_second_edge(backend: Backend) -> None:
    [a, b] = await enqueue(backend, new(), new())
    [d] = await enqueue(backend, replace(after(a), idempotency_key="once"))
    [again] = await enqueue(backend, replace(after(a, b), idempotency_key="once"))
    assert again == d
    assert [r.task_id for r in await backend.dependencies(d)] == [a]
    assert await state(backend, d) == (S.WAITING, 1)


async def test_a_key_repeated_in_one_enqueue_stores_one_set_of_edges(backend: Backend) -> None:
    [a, b] = await enqueue(backend, new(), new())
    ids = await enqueue(
        backend,
        replace(after(a), idempotency_key="twice"),
        replace(after(a, b), idempotency_key="twice"),
    )
    assert ids[0] == ids[1]
    assert [r.task_id for r in await backend.dependencies(ids[0])] == [a]
    assert await state(backend, ids[0]) == (S.WAITING, 1)


async def test_a_dependent_in_the_same_enqueue_as_a_failing_one(backend: Backend) -> None:
    [bad] = await enqueue(backend, new(max_attempts=1))
    await run(backend, (bad, "fail"))
    ids = await backend.enqueue(
        EnqueueParams(
            tasks=[after(bad), after(earlier(0)), after(earlier(0), policy="run")], now=T0
        )
    )
    assert [(await state(backend, i))[0] for i in ids] == [S.CANCELLED, S.CANCELLED, S.PENDING]


async def test_a_waiting_dependent_is_not_handed_to_a_worker(backend: Backend) -> None:
    [a] = await enqueue(backend, new())
    [d] = await enqueue(backend, after(a))
    claimed = await claim(backend, limit=10, at=later(1))
    assert [t.token.task_id for t in claimed] == [a]
    token = LeaseToken(d, 1, "w1")
    late = await backend.finish(FinishParams("w1", [success(token)], now=later(2)))
    assert late.rejected == {token}
    assert await state(backend, d) == (S.WAITING, 1)


async def test_a_callback_of_thousands_of_members_is_released_by_the_last(
    backend: Backend,
) -> None:
    members = 9000  # past Lua's unpack limit (~8000) and SQLite's host parameters per row
    tasks = [new() for _ in range(members)]
    callback = replace(
        new("callback"), after=tuple(earlier(i) for i in range(members)), after_policy="run"
    )
    ids = await backend.enqueue(EnqueueParams(tasks=[*tasks, callback], now=T0))
    assert await state(backend, ids[-1]) == (S.WAITING, members)
    done = 0
    while done < members:
        claimed = await claim(backend, limit=1000, at=later(1))
        finished = await backend.finish(
            FinishParams("w1", [success(t.token) for t in claimed], now=later(1))
        )
        done += len(finished.applied)
    assert await state(backend, ids[-1]) == (S.PENDING, 0)
    records = await backend.dependencies(ids[-1])
    assert [r.task_id for r in records] == ids[:-1]
    assert all(r.settled and r.state is S.SUCCEEDED for r in records)


async def test_an_unknown_dependency_is_refused_before_a_held_key(backend: Backend) -> None:
    [a] = await enqueue(backend, replace(new(), idempotency_key="held"))
    with pytest.raises(TaskNotFoundError):
        await enqueue(
            backend,
            replace(new(), idempotency_key="held", on_conflict="raise"),
            after(a + 1000),
        )


async def test_a_key_repeated_after_a_task_its_dependency_ends_at_once(backend: Backend) -> None:
    [bad] = await enqueue(backend, new(max_attempts=1))
    await run(backend, (bad, "fail"))
    ids = await enqueue(
        backend,
        replace(after(bad), idempotency_key="k", unique_scope="pending"),
        replace(new(), idempotency_key="k", unique_scope="pending"),
    )
    # Both met the key before the first task's dependency ended it.
    assert ids[0] == ids[1]
    assert (await state(backend, ids[0]))[0] is S.CANCELLED


async def test_a_dependent_still_waiting_keeps_its_pending_key(backend: Backend) -> None:
    """A dependent holds a key scoped ``pending`` until a worker starts it:
    the ends it counts while it still waits for others, at its enqueue or
    later, leave the key with it (PostgreSQL's trigger gave it up at every
    write of the dependent's state, a count that left it waiting too)."""
    [a, b, c] = await enqueue(backend, new(), new(), new())
    assert await backend.cancel(a, now=later(1)) is S.CANCELLED
    keyed = replace(after(a, b, c, policy="run"), idempotency_key="k", unique_scope="pending")
    [d] = await backend.enqueue(EnqueueParams(tasks=[keyed], now=later(2)))
    assert await state(backend, d) == (S.WAITING, 2)
    assert await backend.cancel(b, now=later(3)) is S.CANCELLED
    assert await state(backend, d) == (S.WAITING, 1)
    task = await backend.get_task(d, with_attempts=False)
    assert task is not None and task.idempotency_key == "k"
    again = replace(new(), idempotency_key="k", unique_scope="pending")
    assert await enqueue(backend, again) == [d]


async def test_a_claim_hands_out_the_dependent_its_own_sweep_released(backend: Backend) -> None:
    """A claim that ends an expired lease whose crash budget is spent hands
    out, within its limit, the dependent that end released (PostgreSQL's
    claim once read the tasks as they stood before its own ends, and took
    one fewer: none here)."""
    [crashed] = await enqueue(backend, new(max_attempts=1))
    [d] = await enqueue(backend, after(crashed, policy="run"))
    assert [t.token.task_id for t in await claim(backend, at=later(1))] == [crashed]
    handed = await claim(backend, "w2", limit=1, at=later(1 + LEASE))
    assert [t.token.task_id for t in handed] == [d]
    assert (await state(backend, crashed))[0] is S.FAILED
