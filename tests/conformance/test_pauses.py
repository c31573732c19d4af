"""Pauses on every backend: a paused queue or task name is not claimed (nor
reclaimed) until it is resumed; running attempts go on; resuming wakes the
idle workers it held back; the pause is stored."""

from __future__ import annotations

import pytest

from conveyor.backends.params import FinishParams, WorkFilter
from conveyor.backends.protocol import Backend
from conveyor.errors import ConfigurationError
from conveyor.model import PauseKind, TaskState
from tests.conformance.test_tasks import LEASE, claim, enqueue, later, new, success
from tests.conformance.test_wakeups import listening


async def test_a_paused_queue_is_not_claimed_until_resumed(backend: Backend) -> None:
    mail, other = await enqueue(backend, new(queue="mail"), new(queue="default"))
    assert await backend.pause(PauseKind.QUEUE, "mail", now=later(0))
    assert not await backend.pause(PauseKind.QUEUE, "mail")  # paused already
    [taken] = await claim(backend, queues=("mail", "default"), at=later(1))
    assert taken.token.task_id == other
    assert await claim(backend, queues=("mail", "default"), at=later(2)) == []
    [pause] = await backend.list_pauses()
    assert (pause.kind, pause.name, pause.paused_at) == (PauseKind.QUEUE, "mail", later(0))
    assert await backend.resume(PauseKind.QUEUE, "mail")
    assert not await backend.resume(PauseKind.QUEUE, "mail")
    [taken] = await claim(backend, queues=("mail",), at=later(3))
    assert taken.token.task_id == mail
    assert await backend.list_pauses() == []


async def test_a_paused_task_name_is_not_claimed_in_any_queue(backend: Backend) -> None:
    held = await enqueue(backend, new("report", queue="a"), new("report", queue="b"))
    [free] = await enqueue(backend, new("job", queue="a"))
    await backend.pause(PauseKind.TASK, "report")
    taken = await claim(backend, names=("job", "report"), queues=("a", "b"))
    assert [c.token.task_id for c in taken] == [free]
    work = WorkFilter(names=["job", "report"], queues=["a", "b"], now=later(1))
    assert await backend.count_unfinished(work) == 1  # a burst worker does not wait for it
    await backend.resume(PauseKind.TASK, "report")
    taken = await claim(backend, names=("report",), queues=("a", "b"), at=later(1))
    assert sorted(c.token.task_id for c in taken) == held


async def test_a_pause_lets_running_attempts_finish_and_holds_back_their_reclaim(
    backend: Backend,
) -> None:
    first, second = await enqueue(backend, new(), new())
    running = await claim(backend, limit=1)
    assert running[0].token.task_id == first
    await backend.pause(PauseKind.QUEUE, "default")
    result = await backend.finish(
        FinishParams(worker_id="w1", completions=[success(running[0].token)], now=later(1))
    )
    assert result.applied == {running[0].token}
    [other] = await enqueue(backend, new())  # enqueues still store
    # A lease that expires while paused is not taken back either.
    await backend.resume(PauseKind.QUEUE, "default")
    [again] = await claim(backend, limit=1, at=later(2))
    await backend.pause(PauseKind.QUEUE, "default")
    assert await claim(backend, at=later(2 + LEASE + 1)) == []
    task = await backend.get_task(again.token.task_id, with_attempts=False)
    assert task is not None and task.state is TaskState.IN_PROGRESS
    await backend.resume(PauseKind.QUEUE, "default")
    taken = await claim(backend, at=later(2 + LEASE + 2))
    assert again.token.task_id == second
    assert {c.token.task_id for c in taken} == {second, other}
    assert [c.token.attempt for c in taken if c.token.task_id == second] == [2]  # reclaimed


async def test_resuming_wakes_the_queues_it_held_back(backend: Backend) -> None:
    await enqueue(backend, new())
    await backend.pause(PauseKind.TASK, "job")
    async with listening(backend) as listener:
        await backend.resume(PauseKind.TASK, "job")
        assert await listener.expect(lambda w: w == "default") == "default"


@pytest.mark.parametrize(
    ("kind", "name"), [("topic", "x"), (PauseKind.QUEUE, ""), (PauseKind.TASK, "a\x00b")]
)
async def test_a_bad_pause_is_refused(backend: Backend, kind: object, name: str) -> None:
    with pytest.raises(ConfigurationError):
        await backend.pause(kind, name)  # type: ignore[arg-type]
    assert await backend.list_pauses() == []
