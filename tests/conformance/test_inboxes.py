"""Inboxes at the backend level, on every backend, with an injected clock.

A coroutine task's poll ends with a fenced finish that also consumes the
messages the poll saw, sends, and spawns; a message that arrives during a
poll stays and makes the task due again; a child's end reaches its parent
once, however the child ended; sends to tasks that cannot take a message
are refused and store nothing.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

import pytest
from psycopg import sql

from conveyor import payload as codec
from conveyor.backends.params import (
    ClaimedTask,
    ClaimParams,
    Completion,
    Delivery,
    Effects,
    EnqueueParams,
    FinishParams,
    FinishResult,
    NewTask,
    SendParams,
    Transition,
)
from conveyor.backends.postgres import PostgresBackend
from conveyor.backends.protocol import Backend
from conveyor.errors import NoInboxError, TaskFinishedError, TaskNotFoundError
from conveyor.model import MessageKind, Outcome, RetryPolicy, TaskState
from tests.conformance.test_tasks import LEASE, T0, claim, enqueue, later, new, success

NAMES = ("coro", "job")


def coroutine(state: object = None, message: object = None, **fields: object) -> NewTask:
    return NewTask(
        name="coro",
        queue="default",
        payload=codec.encode(state if state is not None else {}),
        priority=0,
        max_attempts=3,
        retry=RetryPolicy(max_attempts=3),
        run_at=T0,
        inbox=True,
        message=codec.encode(message) if message is not None else None,
        **fields,  # type: ignore[arg-type]
    )


def rest(
    task: ClaimedTask,
    state: object,
    *,
    consumed: tuple[int, ...] = (),
    sends: tuple[Delivery, ...] = (),
    spawns: tuple[NewTask, ...] = (),
    sleep_until: datetime | None = None,
) -> Completion:
    """A poll that suspends (or sleeps until ``sleep_until``) with these effects."""
    transition = Transition(
        step=None,
        state=codec.encode(state),
        max_attempts=3,
        retry=RetryPolicy(max_attempts=3),
        run_at=sleep_until,
    )
    return Completion(
        task.token,
        Outcome.SUCCEEDED,
        TaskState.PENDING if sleep_until else TaskState.WAITING,
        transition=transition,
        effects=Effects(consumed=consumed, sends=sends, spawns=spawns),
    )


async def finish(backend: Backend, completion: Completion, at: datetime) -> FinishResult:
    return await backend.finish(FinishParams(completion.token.worker_id, [completion], now=at))


async def send(backend: Backend, task_id: int, body: object, at: datetime = T0) -> int:
    [message_id] = await backend.send(SendParams([Delivery(task_id, codec.encode(body))], now=at))
    return message_id


async def bodies(backend: Backend, task_id: int) -> list[object]:
    return [m.body for m in await backend.inbox(task_id)]


async def claim_one(backend: Backend, at: datetime, worker: str = "w1") -> ClaimedTask:
    [task] = await claim(backend, worker, at=at, names=NAMES, limit=1)
    return task


async def test_a_poll_consumes_what_it_saw_and_waits_for_the_next_message(
    backend: Backend,
) -> None:
    [task_id] = await enqueue(backend, coroutine({"n": 0}, message={"hello": 1}))
    polled = await claim_one(backend, T0)
    seen = await backend.inbox(task_id)
    assert [(m.body, m.kind, m.sender_id) for m in seen] == [
        ({"hello": 1}, MessageKind.MESSAGE, None)
    ]
    done = await finish(backend, rest(polled, {"n": 1}, consumed=(seen[0].id,)), later(1))
    assert done.applied == {polled.token}

    task = await backend.get_task(task_id)
    assert task is not None
    assert (task.state, task.payload, task.inbox) == (TaskState.WAITING, {"n": 1}, True)
    assert await bodies(backend, task_id) == []
    assert await claim(backend, at=later(3600), names=NAMES) == []  # waiting, no lease

    await send(backend, task_id, {"wake": True}, later(2))
    again = await claim_one(backend, later(3))
    assert again.token.task_id == task_id and codec.decode(again.payload) == {"n": 1}
    assert await bodies(backend, task_id) == [{"wake": True}]


async def test_a_message_sent_during_a_poll_stays_and_makes_the_task_due(
    backend: Backend,
) -> None:
    [task_id] = await enqueue(backend, coroutine(message="first"))
    polled = await claim_one(backend, T0)
    seen = await backend.inbox(task_id)
    await send(backend, task_id, "during", later(1))  # after the poll read its inbox
    await finish(backend, rest(polled, {}, consumed=tuple(m.id for m in seen)), later(2))

    task = await backend.get_task(task_id)
    assert task is not None and task.state is TaskState.PENDING  # not waiting: mail is in
    assert await bodies(backend, task_id) == ["during"]
    again = await claim_one(backend, later(3))
    assert again.token.task_id == task_id


async def test_messages_keep_their_order(backend: Backend) -> None:
    [task_id] = await enqueue(backend, coroutine())
    sent = [await send(backend, task_id, i, later(i)) for i in range(5)]
    assert sent == sorted(sent)
    assert await bodies(backend, task_id) == [0, 1, 2, 3, 4]


async def test_a_message_cuts_a_sleep_short(backend: Backend) -> None:
    [task_id] = await enqueue(backend, coroutine())
    polled = await claim_one(backend, T0)
    await finish(backend, rest(polled, {"slept": 1}, sleep_until=later(3600)), later(1))
    assert await claim(backend, at=later(10), names=NAMES) == []
    task = await backend.get_task(task_id)
    assert task is not None and task.state is TaskState.PENDING

    await send(backend, task_id, "up", later(10))
    woken = await claim_one(backend, later(11))
    assert woken.token.task_id == task_id


async def test_a_sleep_without_messages_ends_on_time(backend: Backend) -> None:
    [task_id] = await enqueue(backend, coroutine())
    polled = await claim_one(backend, T0)
    await finish(backend, rest(polled, {}, sleep_until=later(60)), later(1))
    assert await claim(backend, at=later(59), names=NAMES) == []
    assert (await claim_one(backend, later(60))).token.task_id == task_id


async def test_sends_that_cannot_be_delivered_are_refused_and_store_nothing(
    backend: Backend,
) -> None:
    [live, plain, finished] = await enqueue(backend, coroutine(), new("job"), coroutine())
    await backend.cancel(finished, now=T0)
    with pytest.raises(TaskNotFoundError):
        await send(backend, 999_999, "x")
    with pytest.raises(NoInboxError):
        await send(backend, plain, "x")
    with pytest.raises(TaskFinishedError):
        await send(backend, finished, "x")

    batch = [Delivery(live, codec.encode("kept?")), Delivery(finished, codec.encode("x"))]
    with pytest.raises(TaskFinishedError):
        await backend.send(SendParams(batch, now=T0))
    assert await bodies(backend, live) == []  # all or nothing


async def test_a_stale_poll_consumes_sends_and_spawns_nothing(backend: Backend) -> None:
    [task_id, other] = await enqueue(backend, coroutine(message="m1"), coroutine())
    stale = await claim_one(backend, T0)
    assert stale.token.task_id == task_id
    seen = await backend.inbox(task_id)
    # The lease expires and another worker takes the task over.
    [current] = await claim(backend, "w2", at=later(LEASE + 1), names=NAMES, limit=1)
    assert current.token.task_id == task_id

    late = rest(
        stale,
        {"stale": True},
        consumed=tuple(m.id for m in seen),
        sends=(Delivery(other, codec.encode("from stale"), task_id),),
        spawns=(replace(new("job"), parent_id=task_id),),
    )
    result = await finish(backend, late, later(LEASE + 2))
    assert result.rejected == {stale.token}

    assert await bodies(backend, task_id) == ["m1"]
    assert await bodies(backend, other) == []
    task = await backend.get_task(task_id)
    assert task is not None
    assert (task.state, task.payload) == (TaskState.IN_PROGRESS, {})
    assert [t.id for t in await _all(backend)] == [task_id, other]


async def test_a_crashed_poll_leaves_its_messages_for_the_next(backend: Backend) -> None:
    [task_id] = await enqueue(backend, coroutine(message="keep me"))
    await claim_one(backend, T0)  # the worker dies without finishing
    again = await claim_one(backend, later(LEASE + 1), worker="w2")
    assert again.token.task_id == task_id and again.token.attempt == 2
    assert await bodies(backend, task_id) == ["keep me"]


async def test_an_applied_poll_sends_and_spawns(backend: Backend) -> None:
    [parent, peer] = await enqueue(backend, coroutine(), coroutine())
    polled = await claim_one(backend, T0)
    assert polled.token.task_id == parent
    child = replace(coroutine({"c": 1}, message="go"), parent_id=parent)
    await finish(
        backend,
        rest(polled, {}, sends=(Delivery(peer, codec.encode("hi"), parent),), spawns=(child,)),
        later(1),
    )
    [sent] = await backend.inbox(peer)
    assert (sent.body, sent.sender_id) == ("hi", parent)
    [spawned] = [t for t in await _all(backend) if t.id not in (parent, peer)]
    assert (spawned.parent_id, spawned.inbox, spawned.payload) == (parent, True, {"c": 1})
    [first] = await backend.inbox(spawned.id)
    assert (first.body, first.sender_id) == ("go", parent)


async def test_a_poll_s_sends_to_tasks_that_cannot_take_them_are_dropped(
    backend: Backend,
) -> None:
    [task_id, gone, plain] = await enqueue(backend, coroutine(), coroutine(), new("job"))
    await backend.cancel(gone, now=T0)
    polled = await claim_one(backend, T0)
    sends = tuple(
        Delivery(target, codec.encode("lost?"), task_id) for target in (gone, plain, 999_999)
    )
    result = await finish(backend, rest(polled, {"sent": 3}, sends=sends), later(1))
    assert result.applied == {polled.token}  # the poll's outcome stands
    assert await bodies(backend, gone) == [] and await bodies(backend, plain) == []
    task = await backend.get_task(task_id)
    assert task is not None and task.payload == {"sent": 3}


async def test_fifty_children_end_fifty_times_exactly_once(backend: Backend) -> None:
    [parent] = await enqueue(backend, coroutine())
    polled = await claim_one(backend, T0)
    kids = tuple(replace(new("job", payload={"i": i}), parent_id=parent) for i in range(50))
    await finish(backend, rest(polled, {}, spawns=kids), later(1))
    children = [t for t in await _all(backend) if t.parent_id == parent]
    assert len(children) == 50

    running = await claim(backend, at=later(2), names=("job",), limit=50)
    assert len(running) == 50
    done = await backend.finish(
        FinishParams("w1", [success(t.token, t.token.task_id * 10) for t in running], now=later(3))
    )
    assert len(done.applied) == 50

    ends = await backend.inbox(parent)
    assert all(m.kind is MessageKind.END for m in ends)
    assert sorted(m.body["child"] for m in ends) == sorted(t.id for t in children)
    assert all(m.body["result"] == m.body["child"] * 10 for m in ends)
    assert all(m.body["state"] == "succeeded" and m.body["name"] == "job" for m in ends)
    assert all(m.sender_id == m.body["child"] for m in ends)
    parent_task = await backend.get_task(parent)
    assert parent_task is not None and parent_task.state is TaskState.PENDING  # woken

    # A finished child cannot end again: a late write of its lease changes nothing.
    late = await backend.finish(FinishParams("w1", [success(running[0].token)], now=later(4)))
    assert late.rejected == {running[0].token}
    assert len(await backend.inbox(parent)) == 50


async def test_a_child_ends_however_it_ends(backend: Backend) -> None:
    [parent] = await enqueue(backend, coroutine())
    polled = await claim_one(backend, T0)
    kids = tuple(
        replace(new("job", payload={"i": i}, max_attempts=1), parent_id=parent) for i in range(3)
    )
    await finish(backend, rest(polled, {}, spawns=kids), later(1))
    children = sorted(t.id for t in await _all(backend) if t.parent_id == parent)

    await backend.cancel(children[0], now=later(2))  # pending: cancelled at once
    crashed, failing = await claim(backend, at=later(3), names=("job",), limit=2)
    failed = Completion(failing.token, Outcome.FAILED, TaskState.FAILED)
    await backend.finish(FinishParams("w1", [failed], now=later(4)))
    # `crashed` never finishes and its budget (1) is spent: a claim ends it failed.
    assert await claim(backend, at=later(3 + LEASE + 1), names=("job",)) == []

    ends = {m.body["child"]: m.body["state"] for m in await backend.inbox(parent)}
    assert ends == {
        children[0]: "cancelled",
        crashed.token.task_id: "failed",
        failing.token.task_id: "failed",
    }
    assert len(await backend.inbox(parent)) == 3


async def test_cancelling_a_parent_cancels_its_live_children(backend: Backend) -> None:
    [parent] = await enqueue(backend, coroutine())
    polled = await claim_one(backend, T0)
    kids = tuple(replace(coroutine({"k": i}), parent_id=parent) for i in range(3))
    await finish(backend, rest(polled, {}, spawns=kids), later(1))
    children = sorted(t.id for t in await _all(backend) if t.parent_id == parent)
    running = await claim_one(backend, later(2))  # the parent is not due: a child
    assert running.token.task_id in children

    assert await backend.cancel(parent, now=later(3)) is TaskState.CANCELLED
    states = {t.id: (t.state, t.cancel_requested) for t in await _all(backend)}
    for child in children:
        if child == running.token.task_id:
            assert states[child] == (TaskState.IN_PROGRESS, True)
        else:
            assert states[child][0] is TaskState.CANCELLED


async def _all(backend: Backend) -> list:  # type: ignore[type-arg]
    from conveyor.records import TaskFilter

    return sorted(await backend.list_tasks(TaskFilter(limit=1000)), key=lambda t: t.id)


async def test_enqueue_params_carry_first_messages_for_many_tasks(backend: Backend) -> None:
    ids = await backend.enqueue(
        EnqueueParams([coroutine(message={"i": i}) for i in range(3)], now=T0)
    )
    for i, task_id in enumerate(ids):
        assert await bodies(backend, task_id) == [{"i": i}]


async def _claim_with_inbox(backend: Backend, at: datetime) -> ClaimedTask:
    [task] = await backend.claim(
        ClaimParams("w1", NAMES, ("default",), 1, LEASE, now=at, inbox_names=("coro",))
    )
    return task


async def test_a_claim_may_bring_the_inbox_as_it_stood(backend: Backend) -> None:
    # PostgreSQL reads a claimed coroutine task's inbox with its claim (one
    # round trip less per poll); the others leave it to the poll.
    brings = isinstance(backend, PostgresBackend)
    if isinstance(backend, PostgresBackend):
        # Its claim that also takes back expired leases (once per poll
        # interval, in a worker) leaves inboxes to the polls: spent here.
        backend._sweep.interval = 3600
        assert await claim(backend, names=NAMES) == []
    [task_id] = await enqueue(backend, coroutine(message="first"))
    await send(backend, task_id, {"second": [1, 2]}, later(1))
    [empty_id] = await enqueue(backend, coroutine())
    [job_id] = await enqueue(backend, new())
    polled = await _claim_with_inbox(backend, later(2))
    assert polled.token.task_id == task_id
    stored = await backend.inbox(task_id)
    if brings:
        assert polled.inbox == stored
        assert [m.body for m in polled.inbox] == ["first", {"second": [1, 2]}]
    else:
        assert polled.inbox is None
    # A message after the claim is not in what it brought: the poll's
    # completion makes the task due again for it.
    await send(backend, task_id, "late", later(3))
    seen = polled.inbox if polled.inbox is not None else stored
    await finish(backend, rest(polled, {}, consumed=tuple(m.id for m in seen)), later(4))
    assert await bodies(backend, task_id) == ["late"]
    task = await backend.get_task(task_id)
    assert task is not None and task.state is TaskState.PENDING

    rest_of = await backend.claim(
        ClaimParams("w1", NAMES, ("default",), 5, LEASE, now=later(5), inbox_names=("coro",))
    )
    by_id = {t.token.task_id: t for t in rest_of}
    assert set(by_id) == {task_id, empty_id, job_id}
    assert by_id[job_id].inbox is None  # not a coroutine name: not read
    if brings:
        assert by_id[empty_id].inbox == []
        assert [m.body for m in by_id[task_id].inbox or []] == ["late"]


async def test_a_message_row_the_claim_cannot_read_leaves_the_read_to_the_poll(
    backend: Backend,
) -> None:
    if not isinstance(backend, PostgresBackend):
        pytest.skip("only PostgreSQL reads inboxes with its claims")
    [task_id] = await enqueue(backend, coroutine(message="first"))
    async with backend.pool.connection() as conn:  # written around conveyor
        await conn.execute(
            sql.SQL("update {} set created_at = 'infinity' where task_id = %s").format(
                sql.Identifier(backend.schema, "messages")
            ),
            (task_id,),
        )
    polled = await _claim_with_inbox(backend, T0)
    assert polled.inbox is None
    [message] = await backend.inbox(task_id)
    assert message.body == "first"


@pytest.mark.parametrize("child_first", [True, False], ids=["child-first", "parent-first"])
@pytest.mark.parametrize("parent_rests", [False, True], ids=["parent-ends", "parent-rests"])
async def test_a_child_ending_beside_its_parent_in_one_finish(
    backend: Backend, child_first: bool, parent_rests: bool
) -> None:
    """A finish applies its completions, then their endings: a child that
    ends in the same call as its parent finds the parent as the call leaves
    it, whatever the completions' order. Ended: no end message; resting:
    the end message, and the parent due again."""
    [parent] = await enqueue(backend, coroutine())
    polled = await claim_one(backend, T0)
    kid = replace(new("job"), parent_id=parent)
    await finish(backend, rest(polled, {}, spawns=(kid,), sleep_until=later(2)), later(1))
    both = await claim(backend, names=NAMES, limit=2, at=later(3))
    assert len(both) == 2
    [mine] = [c for c in both if c.token.task_id == parent]
    [child] = [c for c in both if c.token.task_id != parent]
    mine_done = (
        rest(mine, {"rested": True})
        if parent_rests
        else Completion(mine.token, Outcome.SUCCEEDED, TaskState.SUCCEEDED, result="1")
    )
    child_done = Completion(child.token, Outcome.SUCCEEDED, TaskState.SUCCEEDED, result="2")
    done = [child_done, mine_done] if child_first else [mine_done, child_done]
    await backend.finish(FinishParams("w1", done, now=later(4)))
    ends = [m.body for m in await backend.inbox(parent)]
    task = await backend.get_task(parent, with_attempts=False)
    assert task is not None
    if parent_rests:
        assert ends == [
            {"child": child.token.task_id, "name": "job", "state": "succeeded", "result": 2}
        ]
        assert task.state is TaskState.PENDING
    else:
        assert ends == []
        assert task.state is TaskState.SUCCEEDED


async def test_a_claim_hands_out_the_parent_its_own_sweep_woke(backend: Backend) -> None:
    """A claim that ends a child's expired lease (its crash budget spent)
    wakes the suspended parent with the child's end, and hands the parent
    out within its limit (PostgreSQL's claim once read the tasks as they
    stood before its own ends, and took one fewer: none here)."""
    [parent] = await enqueue(backend, coroutine())
    polled = await claim_one(backend, T0)
    kid = replace(new("job", max_attempts=1), parent_id=parent)
    await finish(backend, rest(polled, {}, spawns=(kid,)), later(1))
    child = await claim_one(backend, later(2))
    assert child.token.task_id != parent
    woken = await claim(backend, "w2", at=later(2 + LEASE), names=NAMES, limit=1)
    assert [t.token.task_id for t in woken] == [parent]
    assert [m.body["state"] for m in await backend.inbox(parent)] == ["failed"]
