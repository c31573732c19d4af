"""Pruning on every backend: which finished tasks go (their state's cutoff,
oldest first, a batch at a time), which never go (unfinished ones, children
of a live parent), what goes with them, and old workers."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from conveyor.backends.params import FinishParams
from conveyor.backends.protocol import Backend
from conveyor.errors import ConfigurationError
from conveyor.model import TaskState
from conveyor.records import PruneParams, PruneResult, WorkerInfo
from tests.conformance.test_inboxes import coroutine, send
from tests.conformance.test_tasks import claim, enqueue, later, new, success

SUCCEEDED = TaskState.SUCCEEDED


async def finished(backend: Backend, count: int, at: float, name: str = "job") -> list[int]:
    """``count`` tasks of ``name`` that succeed at ``later(at)`` (within their lease)."""
    ids = await enqueue(backend, *(new(name) for _ in range(count)))
    taken = await claim(backend, limit=count, names=(name,))
    await backend.finish(
        FinishParams(worker_id="w1", completions=[success(c.token) for c in taken], now=later(at))
    )
    return ids


async def present(backend: Backend, ids: list[int]) -> list[int]:
    return [i for i in ids if await backend.get_task(i) is not None]


async def test_prune_takes_finished_tasks_past_their_state_cutoff(backend: Backend) -> None:
    old = await finished(backend, 3, at=2)
    young = await finished(backend, 2, at=8)
    [waiting] = await enqueue(backend, new("idle", run_at=later(-5)))
    [cancelled] = await enqueue(backend, new("gone"))
    await backend.cancel(cancelled, now=later(5))
    cutoff = {SUCCEEDED: later(5)}
    assert await backend.count_prunable(PruneParams(cutoff)) == PruneResult(tasks=3, workers=0)
    first = await backend.prune(PruneParams(cutoff, limit=2))
    assert (first.tasks, first.busy) == (2, False)
    assert await present(backend, old) == old[2:]  # oldest ids first
    assert (await backend.prune(PruneParams(cutoff, limit=2))).tasks == 1
    assert (await backend.prune(PruneParams(cutoff, limit=2))).tasks == 0
    assert await present(backend, [*young, waiting, cancelled]) == [*young, waiting, cancelled]
    # Each state has its own cutoff; an unfinished task never goes.
    both = {SUCCEEDED: later(1000), TaskState.CANCELLED: later(6)}
    assert (await backend.prune(PruneParams(both))).tasks == 3
    assert await present(backend, [*young, waiting, cancelled]) == [waiting]


async def test_prune_takes_attempts_and_messages_and_frees_idempotency_keys(
    backend: Backend,
) -> None:
    [task_id] = await enqueue(backend, replace(new(), idempotency_key="once"))
    assert await enqueue(backend, replace(new(), idempotency_key="once")) == [task_id]
    [claimed] = await claim(backend)
    await backend.finish(
        FinishParams(worker_id="w1", completions=[success(claimed.token)], now=later(1))
    )
    assert (await backend.prune(PruneParams({SUCCEEDED: later(2)}))).tasks == 1
    assert await backend.get_task(task_id) is None
    [again] = await enqueue(backend, replace(new(), idempotency_key="once"))
    assert again != task_id  # the key lived as long as its task


async def test_a_child_of_a_live_parent_is_kept(backend: Backend) -> None:
    [parent] = await enqueue(backend, coroutine({"n": 0}))
    [child] = await enqueue(backend, replace(new("kid", max_attempts=1), parent_id=parent))
    [taken] = await claim(backend, names=("kid",))
    await backend.finish(
        FinishParams(worker_id="w1", completions=[success(taken.token)], now=later(1))
    )
    cutoff = PruneParams({SUCCEEDED: later(10), TaskState.CANCELLED: later(10)})
    assert (await backend.prune(cutoff)).tasks == 0  # its parent may read its end yet
    assert await backend.count_prunable(cutoff) == PruneResult(tasks=0, workers=0)
    await send(backend, parent, {"hello": 1})
    await backend.cancel(parent, now=later(2))
    assert (await backend.prune(cutoff)).tasks == 2  # the parent and its child
    assert await present(backend, [parent, child]) == []


async def test_prune_takes_workers_stopped_or_silent_before_their_cutoff(
    backend: Backend,
) -> None:
    for worker_id in ("gone", "live"):
        await backend.register_worker(
            WorkerInfo(id=worker_id, host="h", pid=1, queues=("default",), concurrency=1)
        )
    await backend.stop_worker("gone")
    now = datetime.now(UTC)
    assert (
        await backend.prune(PruneParams({}, workers_before=now - timedelta(hours=1)))
    ).workers == 0
    hence = now + timedelta(minutes=5)
    assert await backend.count_prunable(PruneParams({}, workers_before=hence)) == PruneResult(
        tasks=0, workers=2
    )
    assert (await backend.prune(PruneParams({}, workers_before=hence))).workers == 2


@pytest.mark.parametrize("bad", [{"before": {TaskState.PENDING: later(0)}}, {"limit": -1}])
def test_prune_params_refuse_what_cannot_be_pruned(bad: dict[str, object]) -> None:
    with pytest.raises(ConfigurationError):
        PruneParams(**{"before": {}, **bad})  # type: ignore[arg-type]


@pytest.mark.parametrize("first", [SUCCEEDED, TaskState.CANCELLED])
async def test_a_batch_takes_the_states_in_the_order_given(
    backend: Backend, first: TaskState
) -> None:
    """One batch takes the states of ``before`` in the order given, each
    oldest id first, so a limit that stops within the first state leaves
    the next one whole, whatever their ids (PostgreSQL once took them in
    the order of its grouping of the cutoffs)."""
    cancelled = await enqueue(backend, new("gone"), new("gone"))
    for at, task_id in enumerate(cancelled, start=1):
        await backend.cancel(task_id, now=later(at))
    succeeded = await finished(backend, 2, at=3)
    second = TaskState.CANCELLED if first is SUCCEEDED else SUCCEEDED
    by_state = {SUCCEEDED: succeeded, TaskState.CANCELLED: cancelled}
    cutoffs = {first: later(100), second: later(100)}
    assert (await backend.prune(PruneParams(cutoffs, limit=1))).tasks == 1
    assert await present(backend, by_state[first]) == by_state[first][1:]
    assert await present(backend, by_state[second]) == by_state[second]
    assert (await backend.prune(PruneParams(cutoffs, limit=2))).tasks == 2
    assert await present(backend, [*by_state[first], *by_state[second]]) == by_state[second][1:]
