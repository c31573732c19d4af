"""A poll's completion on PostgreSQL sends its COMMIT before it reads the
finish's rows; ``fence_check`` fails the transaction if a completion whose
lease its lock found live was not recorded, so that none of its effects
(consumed messages, sends, spawned children) can stay without it.

Under the row locks that cannot happen; here a finish that records nothing
stands in for a fence that moved.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from conveyor import payload as codec
from conveyor.backends.params import Delivery, FinishParams
from conveyor.backends.postgres import PostgresBackend
from conveyor.errors import BackendError
from conveyor.model import TaskState
from conveyor.records import TaskFilter
from tests.conformance.test_inboxes import NAMES, coroutine, rest
from tests.conformance.test_tasks import claim, enqueue, later

RECORDS_NOTHING = b"select 1::bigint, 1::int where false"
"""A finish that records no completion, whatever its arguments."""


@pytest.mark.parametrize("spawns", [False, True], ids=["pipelined", "one-at-a-time"])
async def test_a_completion_the_finish_does_not_record_leaves_none_of_its_effects(
    backend: PostgresBackend, spawns: bool
) -> None:
    [task_id, peer] = await enqueue(backend, coroutine({}, message={"first": True}), coroutine())
    [polled] = await claim(backend, names=NAMES, at=later(1), limit=1)
    assert polled.token.task_id == task_id
    [first] = await backend.inbox(task_id)
    child = replace(coroutine({"c": 1}), parent_id=task_id)
    completion = rest(
        polled,
        {"seen": 1},
        consumed=(first.id,),
        sends=(Delivery(peer, codec.encode("hi"), task_id),),
        spawns=(child,) if spawns else (),
    )
    backend.sql = {**backend.sql, "finish": RECORDS_NOTHING}
    with pytest.raises(BackendError, match="a lease fence moved under its row lock"):
        await backend.finish(FinishParams("w1", [completion], now=later(2)))
    task = await backend.get_task(task_id, with_attempts=False)
    assert task is not None and task.state is TaskState.IN_PROGRESS
    assert [m.id for m in await backend.inbox(task_id)] == [first.id]  # not consumed
    assert await backend.inbox(peer) == []  # not sent
    assert {t.id for t in await backend.list_tasks(TaskFilter())} == {task_id, peer}  # no child


async def test_the_check_passes_a_completion_the_finish_recorded(
    backend: PostgresBackend,
) -> None:
    [task_id, peer] = await enqueue(backend, coroutine({}, message={"first": True}), coroutine())
    [polled] = await claim(backend, names=NAMES, at=later(1), limit=1)
    [first] = await backend.inbox(task_id)
    sends = (Delivery(peer, codec.encode("hi"), task_id),)
    result = await backend.finish(
        FinishParams("w1", [rest(polled, {}, consumed=(first.id,), sends=sends)], now=later(2))
    )
    assert result.applied == {polled.token}
    assert [m.body for m in await backend.inbox(peer)] == ["hi"]
