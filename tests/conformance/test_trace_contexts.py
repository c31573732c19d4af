"""Trace contexts at the backend level, on every backend: what a task or a
message stores (``NewTask.trace``, ``Delivery.trace``) comes back with its
claim or its inbox, through every way in: one task, a uniform batch, a
mixed batch, a keyed one, a spawn and its first message, a poll's sends."""

from __future__ import annotations

from dataclasses import replace

from conveyor.backends.params import Delivery, NewTask, SendParams
from conveyor.backends.protocol import Backend
from conveyor.model import TaskState
from tests.conformance.test_inboxes import claim_one, coroutine, finish, rest
from tests.conformance.test_tasks import T0, claim, enqueue, later, new

CONTEXT = '{"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}'


def traced(task: NewTask, n: int) -> NewTask:
    return replace(task, trace=CONTEXT.replace("b7ad", f"{n:04x}"))


async def test_every_way_in_stores_the_task_s_context(backend: Backend) -> None:
    one = [traced(new(), 1)]
    uniform = [traced(new(), 2), traced(new(), 2)]
    mixed = [traced(new(priority=1), 3), new(priority=2), traced(new(priority=3), 4)]
    keyed = [replace(traced(new(), 5), idempotency_key="k"), replace(new(), concurrency_key="c")]
    expected: dict[int, str | None] = {}
    for batch in (one, uniform, mixed, keyed):
        ids = await enqueue(backend, *batch)
        expected.update({i: t.trace for i, t in zip(ids, batch, strict=True)})
    claimed = await claim(backend, limit=20, at=later(1))
    assert {t.token.task_id: t.trace for t in claimed} == expected
    assert None in expected.values() and len(set(expected.values())) == 6


async def test_spawns_and_messages_carry_their_sender_s_context(backend: Backend) -> None:
    [task_id] = await enqueue(backend, coroutine({"n": 0}))
    [other] = await enqueue(backend, coroutine({"n": 1}))
    [sent] = await backend.send(SendParams([Delivery(task_id, '"hello"', trace=CONTEXT)], now=T0))
    [untraced] = await backend.send(SendParams([Delivery(task_id, '"plain"')], now=T0))
    assert [(m.id, m.trace) for m in await backend.inbox(task_id)] == [
        (sent, CONTEXT),
        (untraced, None),
    ]
    polled = await claim_one(backend, later(1))
    assert polled.token.task_id == task_id
    child = traced(replace(coroutine(message={"first": True}), name="job", parent_id=task_id), 7)
    poll = rest(
        polled,
        {"n": 1},
        consumed=(sent, untraced),
        sends=(Delivery(other, '"from the poll"', task_id, trace=traced(new(), 8).trace),),
        spawns=(child,),
    )
    result = await finish(backend, poll, later(2))
    assert result.applied == {polled.token}
    [message] = await backend.inbox(other)
    assert (message.body, message.sender_id, message.trace) == (
        "from the poll",
        task_id,
        traced(new(), 8).trace,
    )
    [spawned] = await claim(backend, at=later(3), names=("job",))
    assert spawned.trace == child.trace and spawned.parent_id == task_id
    [first] = await backend.inbox(spawned.token.task_id)
    assert (first.body, first.trace) == ({"first": True}, child.trace)
    task = await backend.get_task(task_id)
    assert task is not None and task.state is TaskState.WAITING
