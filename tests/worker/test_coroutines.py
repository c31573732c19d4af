"""Coroutine tasks with inboxes, run by a real worker, on every backend."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import conveyor
from conveyor import (
    MessageKind,
    NoInboxError,
    Outcome,
    PayloadError,
    Poll,
    RetryPolicy,
    TaskFinishedError,
    TaskNotFoundError,
    TaskState,
)
from conveyor.model import Task
from conveyor.testing import drain_async

# Polls retried at once, so a burst drain runs the retry too.
FAST = RetryPolicy(max_attempts=3, initial_interval=0, max_interval=0, jitter=0)

Outcomes = conveyor.Sleep | conveyor.Suspend | conveyor.Done


@pytest.fixture
def app(any_app: conveyor.App) -> conveyor.App:
    return any_app


async def children_of(app: conveyor.App, parent_id: int) -> list[Task]:
    tasks = await app.list_tasks_async(limit=1000)
    return sorted((t for t in tasks if t.parent_id == parent_id), key=lambda t: t.id)


async def test_a_fan_out_of_50_children_collects_each_child_s_end_once_with_its_result(
    app: conveyor.App,
) -> None:
    seen: list[conveyor.Message] = []

    @app.task()
    async def square(n: int) -> int:
        return n * n

    @app.coroutine("fan", retry=FAST)
    async def fan(poll: Poll) -> Outcomes:
        if not poll.state["spawned"]:
            for n in range(50):
                poll.spawn(square, args={"n": n})
            poll.state["spawned"] = True
        seen.extend(poll.inbox)
        for message in poll.inbox:
            poll.state["ends"].append([message.body["child"], message.body["result"]])
        if len(poll.state["ends"]) == 50:
            return conveyor.done(poll.state["ends"])
        return conveyor.suspend()

    async with app:
        handle = await fan.start_async({"spawned": False, "ends": []})
        await drain_async(app, concurrency=8)
        task = await handle.get_async()
        children = await children_of(app, handle.id)
        leftover = await app.inbox_async(handle.id)

    assert task.state is TaskState.SUCCEEDED
    assert len(children) == 50
    assert all(c.state is TaskState.SUCCEEDED and c.name == "square" for c in children)
    # Exactly 50 end messages, each child's once, none seen by two committed polls.
    assert len(seen) == 50
    assert len({m.id for m in seen}) == 50
    assert all(m.kind is MessageKind.END and m.is_end for m in seen)
    assert sorted(m.body["child"] for m in seen) == [c.id for c in children]
    assert all(m.sender_id == m.body["child"] for m in seen)
    assert all(m.body["name"] == "square" and m.body["state"] == "succeeded" for m in seen)
    # Each end carries its own child's result.
    squares = {c.id: c.payload["n"] ** 2 for c in children}
    assert sorted(task.result) == sorted([child, squares[child]] for child in squares)
    assert sorted(r for _, r in task.result) == sorted(n * n for n in range(50))
    assert leftover == []


async def test_two_coroutines_play_ping_pong_for_n_rounds(app: conveyor.App) -> None:
    rounds = 20

    @app.coroutine("pong", retry=FAST)
    async def pong(poll: Poll) -> Outcomes:
        for message in poll.inbox:
            if message.body.get("stop"):
                return conveyor.done({"got": poll.state["got"], "parent": poll.parent_id})
            sender = message.sender_id
            assert sender is not None and sender == poll.parent_id  # the spawn's message too
            poll.state["got"].append(message.body["n"])
            poll.send(sender, {"n": message.body["n"] + 1})
        return conveyor.suspend()

    @app.coroutine("ping", retry=FAST)
    async def ping(poll: Poll) -> Outcomes:
        state = poll.state
        if not state["served"]:
            poll.spawn(pong, {"n": 0}, state={"got": []})
            state["served"] = True
        for message in poll.inbox:
            if message.is_end:
                state["pong"] = message.body
                return conveyor.done(state)
            sender = message.sender_id
            assert sender is not None
            if sender not in state["senders"]:
                state["senders"].append(sender)
            state["got"].append(message.body["n"])
            if len(state["got"]) < rounds:
                poll.send(sender, {"n": message.body["n"] + 1})
            else:
                poll.send(sender, {"stop": True})
        return conveyor.suspend()

    async with app:
        handle = await ping.start_async({"served": False, "got": [], "senders": []})
        await drain_async(app, concurrency=2)
        task = await handle.get_async()
        [child] = await children_of(app, handle.id)

    assert task.state is TaskState.SUCCEEDED, task
    assert child.state is TaskState.SUCCEEDED and child.name == "pong"
    result = task.result
    assert result["got"] == list(range(1, 2 * rounds, 2))  # ping got the odd balls
    assert result["senders"] == [child.id]
    assert result["pong"]["child"] == child.id
    assert result["pong"]["state"] == "succeeded"
    assert result["pong"]["result"] == {
        "got": list(range(0, 2 * rounds, 2)),  # pong got the even ones
        "parent": handle.id,
    }
    assert child.result == result["pong"]["result"]


@pytest.mark.parametrize("completion", ["suspend", "sleep"])
async def test_a_message_sent_during_a_poll_waits_for_the_next_poll_which_comes_at_once(
    app: conveyor.App, completion: str
) -> None:
    started, release = asyncio.Event(), asyncio.Event()
    polls: list[list[Any]] = []

    @app.coroutine("listener", retry=FAST)
    async def listener(poll: Poll) -> Outcomes:
        polls.append([m.body for m in poll.inbox])
        if len(polls) == 1:
            started.set()
            await release.wait()
            return conveyor.suspend() if completion == "suspend" else conveyor.sleep(3600)
        return conveyor.done(len(polls))

    async with app:
        handle = await listener.start_async({}, message="first")
        draining = asyncio.create_task(drain_async(app))
        await asyncio.wait_for(started.wait(), 10)
        await app.send_async(handle.id, "second")
        assert [m.body for m in await app.inbox_async(handle.id)] == ["first", "second"]
        release.set()
        # The drain ends once nothing is due: had the task stayed waiting
        # (or asleep for an hour), it would end with the task not finished.
        await asyncio.wait_for(draining, 20)
        task = await handle.get_async()
        leftover = await app.inbox_async(handle.id)

    assert polls == [["first"], ["second"]]
    assert task.state is TaskState.SUCCEEDED and task.result == 2
    assert [a.outcome for a in task.attempts] == [Outcome.SUCCEEDED, Outcome.SUCCEEDED]
    assert leftover == []


async def test_a_failed_poll_is_retried_with_the_same_messages_and_its_effects_undone(
    app: conveyor.App,
) -> None:
    sink_got: list[tuple[Any, int | None]] = []
    polls: list[tuple[list[int], dict[str, Any]]] = []
    side_runs: list[int] = []

    @app.task()
    async def side(n: int) -> int:
        side_runs.append(n)
        return n

    @app.coroutine("sink", retry=FAST)
    async def sink(poll: Poll) -> Outcomes:
        sink_got.extend((m.body, m.sender_id) for m in poll.inbox)
        return conveyor.suspend()

    @app.coroutine("flaky", retry=FAST)
    async def flaky(poll: Poll) -> Outcomes:
        polls.append(([m.id for m in poll.inbox], dict(poll.state)))
        attempt = len(polls)
        poll.send(poll.state["sink"], {"from": attempt})
        if attempt == 1:
            poll.spawn(side, args={"n": 1})
            poll.state["dirty"] = True
            raise RuntimeError("the poll broke after sending and spawning")
        return conveyor.done([m.body for m in poll.inbox])

    async with app:
        target = await sink.start_async({})
        await drain_async(app)
        handle = await flaky.start_async({"sink": target.id}, message="a")
        await app.send_async(handle.id, "b")
        await drain_async(app)
        task = await handle.get_async()
        sink_task = await target.get_async()
        spawned = await children_of(app, handle.id)

    assert task.state is TaskState.SUCCEEDED
    assert [a.outcome for a in task.attempts] == [Outcome.FAILED, Outcome.SUCCEEDED]
    assert task.attempts[0].error_type == "RuntimeError"
    # The retry saw the very same messages and the state from before the failed poll.
    assert len(polls) == 2
    assert polls[0][0] == polls[1][0] and len(polls[0][0]) == 2
    assert polls[1][1] == {"sink": target.id}
    assert task.result == ["a", "b"]
    # Only the successful poll's send landed; the failed poll's spawn never happened.
    assert sink_got == [({"from": 2}, handle.id)]
    assert sink_task.state is TaskState.WAITING
    assert spawned == []
    assert side_runs == []


async def test_a_message_cuts_a_long_sleep_short(app: conveyor.App) -> None:
    polls: list[list[Any]] = []

    @app.coroutine("napper", retry=FAST)
    async def napper(poll: Poll) -> Outcomes:
        polls.append([m.body for m in poll.inbox])
        if not poll.inbox:
            return conveyor.sleep(3600)
        return conveyor.done(poll.inbox[0].body)

    async with app:
        handle = await napper.start_async({})
        await drain_async(app)
        asleep = await handle.get_async()
        assert asleep.state is TaskState.PENDING  # not due: the drain left it
        assert asleep.run_at > datetime.now(UTC) + timedelta(seconds=3500)
        assert polls == [[]]

        begun = asyncio.get_running_loop().time()
        await app.send_async(handle.id, {"wake": "up"})
        await drain_async(app)
        elapsed = asyncio.get_running_loop().time() - begun
        task = await handle.get_async()

    assert polls == [[], [{"wake": "up"}]]
    assert task.state is TaskState.SUCCEEDED and task.result == {"wake": "up"}
    assert elapsed < 10


async def test_app_send_refuses_what_it_cannot_deliver_and_sends_nothing(
    app: conveyor.App,
) -> None:
    @app.task()
    async def plain() -> None:
        return None

    @app.coroutine("quick", retry=FAST)
    async def quick(poll: Poll) -> Outcomes:
        return conveyor.done("over")

    @app.coroutine("patient", retry=FAST)
    async def patient(poll: Poll) -> Outcomes:
        return conveyor.suspend()

    oversize = {"blob": "x" * app.max_payload_bytes}
    async with app:
        plain_handle = await plain.enqueue_async()
        finished = await quick.start_async({})
        waiting = await patient.start_async({})
        await drain_async(app)
        assert (await finished.get_async()).state is TaskState.SUCCEEDED
        assert (await waiting.get_async()).state is TaskState.WAITING

        with pytest.raises(TaskNotFoundError):
            await app.send_async(waiting.id + 1000, "hello")
        with pytest.raises(NoInboxError):
            await app.send_async(plain_handle.id, "hello")
        with pytest.raises(TaskFinishedError):
            await app.send_async(finished.id, "hello")
        with pytest.raises(PayloadError):
            await app.send_async(waiting.id, oversize)
        # The size is checked before any I/O: it wins over a missing task.
        with pytest.raises(PayloadError):
            await app.send_async(waiting.id + 1000, oversize)

        assert await app.inbox_async(waiting.id) == []
        assert await app.inbox_async(finished.id) == []
        assert (await waiting.get_async()).state is TaskState.WAITING  # not woken
        assert await drain_async(app) == 0


async def test_an_oversize_send_from_a_poll_fails_that_poll_and_sends_nothing(
    app: conveyor.App,
) -> None:
    sink_got: list[Any] = []
    polls: list[list[int]] = []

    @app.coroutine("sink", retry=FAST)
    async def sink(poll: Poll) -> Outcomes:
        sink_got.extend(m.body for m in poll.inbox)
        return conveyor.suspend()

    @app.coroutine("loud", retry=FAST)
    async def loud(poll: Poll) -> Outcomes:
        polls.append([m.id for m in poll.inbox])
        poll.send(poll.state["sink"], "small, sent before the big one")
        if len(polls) == 1:
            poll.send(poll.state["sink"], "x" * app.max_payload_bytes)
        return conveyor.done(len(polls))

    async with app:
        target = await sink.start_async({})
        handle = await loud.start_async({"sink": target.id}, message="go")
        await drain_async(app)
        first = await handle.get_async()
        inbox_after_failure = await app.inbox_async(handle.id)
        got_after_failure = list(sink_got)
        # A PayloadError fails the task at once (no retry can fix a payload);
        # a manual retry runs the poll again, on the messages still unread.
        await app.retry_async(handle.id)
        await drain_async(app)
        task = await handle.get_async()

    assert first.state is TaskState.FAILED
    assert [a.outcome for a in first.attempts] == [Outcome.FAILED]
    assert "PayloadTooLargeError" in (first.attempts[0].error_type or "")
    assert [m.body for m in inbox_after_failure] == ["go"]
    assert got_after_failure == []  # not even the small send before the big one
    assert task.state is TaskState.SUCCEEDED and task.result == 2
    assert polls[0] == polls[1] and len(polls[0]) == 1
    assert sink_got == ["small, sent before the big one"]


async def test_yield_reaches_the_parent_from_the_child(app: conveyor.App) -> None:
    parent_saw: list[conveyor.Message] = []
    child_saw: list[int | None] = []

    @app.coroutine("worker_bee", retry=FAST)
    async def worker_bee(poll: Poll) -> Outcomes:
        child_saw.append(poll.parent_id)
        for message in poll.inbox:
            for step in range(message.body["steps"]):
                poll.yield_({"progress": step + 1})
        return conveyor.done("all done")

    @app.coroutine("hive", retry=FAST)
    async def hive(poll: Poll) -> Outcomes:
        if not poll.state["spawned"]:
            poll.spawn(worker_bee, {"steps": 3})
            poll.state["spawned"] = True
        parent_saw.extend(poll.inbox)
        if any(m.is_end for m in poll.inbox):
            return conveyor.done([m.body for m in parent_saw])
        return conveyor.suspend()

    @app.coroutine("orphan", retry=FAST)
    async def orphan(poll: Poll) -> Outcomes:
        try:
            poll.yield_("to nobody")
        except conveyor.ConfigurationError as exc:
            return conveyor.done(f"refused: {exc}")
        return conveyor.done("yielded")

    async with app:
        handle = await hive.start_async({"spawned": False})
        lonely = await orphan.start_async({})
        await drain_async(app)
        task = await handle.get_async()
        [child] = await children_of(app, handle.id)
        orphan_task = await lonely.get_async()

    assert task.state is TaskState.SUCCEEDED
    assert child.parent_id == handle.id
    assert child_saw == [handle.id]
    yields = [m for m in parent_saw if m.kind is MessageKind.MESSAGE]
    [end] = [m for m in parent_saw if m.is_end]
    assert len(parent_saw) == 4
    assert [m.body for m in yields] == [{"progress": n} for n in (1, 2, 3)]
    assert all(m.sender_id == child.id for m in parent_saw)
    assert end.body == {
        "child": child.id,
        "name": "worker_bee",
        "state": "succeeded",
        "result": "all done",
    }
    assert orphan_task.state is TaskState.SUCCEEDED
    assert orphan_task.result.startswith("refused:")


async def test_a_child_s_end_comes_after_what_its_last_poll_sent(app: conveyor.App) -> None:
    """The end is the child's end-of-stream: the messages its last poll sent
    (written in the same completion) come before it, in id order."""
    parent_saw: list[tuple[MessageKind, Any]] = []

    @app.coroutine("last_words", retry=FAST)
    async def last_words(poll: Poll) -> Outcomes:
        poll.yield_("almost done")
        poll.send(poll.parent_id or 0, "goodbye")
        return conveyor.done("finished")

    @app.coroutine("listener", retry=FAST)
    async def listener(poll: Poll) -> Outcomes:
        if not poll.state["spawned"]:
            poll.spawn(last_words, state={})
            poll.state["spawned"] = True
        parent_saw.extend((m.kind, m.body) for m in poll.inbox)
        if any(m.is_end for m in poll.inbox):
            return conveyor.done()
        return conveyor.suspend()

    async with app:
        handle = await listener.start_async({"spawned": False})
        await drain_async(app)
        task = await handle.get_async()

    assert task.state is TaskState.SUCCEEDED
    assert [kind for kind, _ in parent_saw] == [
        MessageKind.MESSAGE,
        MessageKind.MESSAGE,
        MessageKind.END,
    ], parent_saw
    assert [body for _, body in parent_saw[:2]] == ["almost done", "goodbye"]


async def test_cancelling_a_waiting_parent_cancels_its_live_children(app: conveyor.App) -> None:
    polled: list[str] = []

    @app.task()
    async def later(n: int) -> int:
        polled.append("later")
        return n

    @app.task()
    async def quick(n: int) -> int:
        return n

    @app.coroutine("leaf", retry=FAST)
    async def leaf(poll: Poll) -> Outcomes:
        polled.append("leaf")
        return conveyor.suspend()

    @app.coroutine("branch", retry=FAST)
    async def branch(poll: Poll) -> Outcomes:
        polled.append("branch")
        if not poll.state.get("spawned"):
            poll.spawn(leaf, state={})
            poll.state["spawned"] = True
        return conveyor.suspend()

    @app.coroutine("root", retry=FAST)
    async def root(poll: Poll) -> Outcomes:
        polled.append("root")
        if not poll.state.get("spawned"):
            poll.spawn(leaf, state={})
            poll.spawn(leaf, state={})
            poll.spawn(branch, state={})
            poll.spawn(later, args={"n": 1}, delay=3600)
            poll.spawn(quick, args={"n": 2})
            poll.state["spawned"] = True
        return conveyor.suspend()

    async with app:
        handle = await root.start_async({})
        await drain_async(app)
        children = await children_of(app, handle.id)
        [branch_task] = [c for c in children if c.name == "branch"]
        [grandchild] = await children_of(app, branch_task.id)
        assert (await handle.get_async()).state is TaskState.WAITING
        before = {c.name: c.state for c in children}
        assert before == {
            "leaf": TaskState.WAITING,
            "branch": TaskState.WAITING,
            "later": TaskState.PENDING,
            "quick": TaskState.SUCCEEDED,
        }
        assert grandchild.state is TaskState.WAITING

        assert await app.cancel_async(handle.id) is TaskState.CANCELLED
        polls_before = len(polled)
        assert await drain_async(app) == 0
        parent = await handle.get_async()
        after = [await app.get_async(c.id) for c in children]
        grandchild_after = await app.get_async(grandchild.id)

    assert parent.state is TaskState.CANCELLED
    states = {(t.name, t.state) for t in after if t is not None}
    assert states == {
        ("leaf", TaskState.CANCELLED),
        ("branch", TaskState.CANCELLED),
        ("later", TaskState.CANCELLED),
        ("quick", TaskState.SUCCEEDED),  # finished before: not live, left alone
    }
    assert len(after) == 5
    assert grandchild_after is not None and grandchild_after.state is TaskState.CANCELLED
    assert len(polled) == polls_before  # nothing ran after the cancel
