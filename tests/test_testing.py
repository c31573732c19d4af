"""conveyor.testing: drain, inline mode, in_memory, the fake clock, what is enqueued,
calling a task directly, and the time libraries."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import conveyor
from conveyor import testing
from conveyor.errors import TaskFailedError


@pytest.fixture(params=["memory", "sqlite"])
def app(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[conveyor.App]:
    url = (
        f"memory://{uuid.uuid4().hex}"
        if request.param == "memory"
        else f"sqlite:///{tmp_path / 'tasks.db'}"
    )
    application = conveyor.App(url)
    yield application
    application.close()


def test_drain_runs_every_due_task_and_what_they_enqueue(app: conveyor.App) -> None:
    seen: list[str] = []

    @app.task
    def follow_up(word: str) -> None:
        seen.append(f"follow-up {word}")

    @app.task
    def first(word: str) -> str:
        seen.append(word)
        follow_up.enqueue(word=word)
        return word.upper()

    @app.task(queue="other")
    def elsewhere() -> None:
        seen.append("elsewhere")

    handles = [first.enqueue(word=w) for w in ("a", "b")]
    later = elsewhere.enqueue()
    assert seen == []
    assert testing.drain(app, queues=["default"]) == 4
    assert sorted(seen) == ["a", "b", "follow-up a", "follow-up b"]
    assert [h.result(timeout=1) for h in handles] == ["A", "B"]
    assert app.get(later.id).state is conveyor.TaskState.PENDING  # not its queue
    assert testing.drain(app) == 1
    assert seen[-1] == "elsewhere"
    assert testing.drain(app) == 0


def test_inline_mode_runs_tasks_before_enqueue_returns() -> None:
    app = conveyor.App(f"memory://{uuid.uuid4().hex}?inline=true")
    order: list[str] = []

    @app.task
    def child(n: int) -> int:
        order.append(f"child {n}")
        return n * 10

    @app.task
    async def parent(n: int) -> int:
        order.append("parent")
        await child.enqueue_async(n=n)
        return n

    @app.task(retry=conveyor.RetryPolicy(max_attempts=1))
    def broken() -> None:
        raise ValueError("nope")

    handle = parent.enqueue(n=4)
    assert order == ["parent", "child 4"]  # done, child included, on return
    assert app.get(handle.id).state is conveyor.TaskState.SUCCEEDED
    assert handle.result(timeout=0) == 4

    failed = broken.enqueue()
    assert app.get(failed.id).state is conveyor.TaskState.FAILED
    with pytest.raises(TaskFailedError, match="nope"):
        failed.result(timeout=0)
    app.close()


async def test_inline_mode_works_from_async_code_too() -> None:
    app = conveyor.App(f"memory://{uuid.uuid4().hex}?inline=1")

    @app.task
    async def double(n: int) -> int:
        return n * 2

    async with app:
        handle = await double.enqueue_async(n=21)
        assert (await app.get_async(handle.id)).result == 42


def test_memory_urls_reject_unknown_options() -> None:
    with pytest.raises(conveyor.ConfigurationError, match="unknown memory URL option"):
        conveyor.App("memory://x?durable=yes")
    with pytest.raises(conveyor.ConfigurationError, match="inline must be"):
        conveyor.App("memory://x?inline=maybe")


# -- conveyor.testing comes with `import conveyor` ------------------------------


def test_import_conveyor_alone_gives_conveyor_testing() -> None:
    code = "import sys, conveyor; print(conveyor.testing.drain.__module__, 'pytest' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()
    assert out == ["conveyor.testing.runs", "False"]  # and without importing pytest


# -- in_memory: an app made at import time, on a fresh store for a while -------


def test_in_memory_swaps_an_app_that_already_used_its_store_and_restores_it(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'real.db'}"
    app = conveyor.App(url)

    @app.task
    def note(text: str) -> None: ...

    real = note.enqueue(text="in the real store")
    with testing.in_memory(app) as same:
        assert same is app and app.url.startswith("memory://conveyor-test-")
        assert app.list_tasks() == []  # fresh and empty
        note.enqueue(text="in memory")
        assert [t.payload for t in testing.enqueued(note)] == [{"text": "in memory"}]
        first_store = app.url
    assert app.url == url
    assert [t.payload for t in testing.enqueued(note)] == [{"text": "in the real store"}]
    assert real.id == testing.enqueued(note)[0].id
    with testing.in_memory(app):
        assert app.url == first_store  # the name is reused...
        assert app.list_tasks() == []  # ...by an emptied store
    app.close()


async def test_in_memory_serves_async_code_and_restores_the_store_of_the_loop(
    tmp_path: Path,
) -> None:
    app = conveyor.App(f"sqlite:///{tmp_path / 'real.db'}")

    @app.task
    async def double(n: int) -> int:
        return n * 2

    kept = await double.enqueue_async(n=1)  # opens a SQLite backend on this loop
    with testing.in_memory(app):
        handle = await double.enqueue_async(n=21)
        assert await testing.drain_async(app) == 1
        assert (await app.get_async(handle.id)).result == 42  # type: ignore[union-attr]
    assert (await app.get_async(kept.id)).state is conveyor.TaskState.PENDING  # type: ignore[union-attr]
    await app.aclose()
    app.close()


def test_client_use_validates_first_and_changes_nothing_on_a_bad_url() -> None:
    app = conveyor.App(f"memory://{uuid.uuid4().hex}")
    before = app.url
    with pytest.raises(conveyor.ConfigurationError, match="unsupported backend URL"):
        app.use("redis2://nowhere")
    assert app.url == before
    app.close()


# -- the fake clock ---------------------------------------------------------------


def test_fake_clock_moves_forward_only_and_only_when_told() -> None:
    start = datetime(2030, 1, 1, tzinfo=UTC)
    clock = testing.FakeClock(start)
    assert clock.now() == start == clock.now()
    assert clock.advance(90) == start + timedelta(seconds=90)
    assert clock.advance(timedelta(hours=1)) == start + timedelta(seconds=3690)
    assert clock.move_to(datetime(2031, 1, 1, tzinfo=UTC)).year == 2031
    for bad in (-1, float("nan"), True, "1"):
        with pytest.raises(conveyor.ConfigurationError):
            clock.advance(bad)  # type: ignore[arg-type]
    with pytest.raises(conveyor.ConfigurationError, match="only moves forward"):
        clock.move_to(start)
    with pytest.raises(conveyor.ConfigurationError, match="timezone-aware"):
        testing.FakeClock(datetime(2030, 1, 1))


@pytest.fixture
def clocked() -> Iterator[tuple[conveyor.App, testing.FakeClock]]:
    """An app on a fresh memory store that follows a fake clock."""
    app = conveyor.App(f"memory://{uuid.uuid4().hex}")
    clock = testing.FakeClock(datetime(2030, 1, 1, tzinfo=UTC))
    with testing.in_memory(app, clock=clock):
        yield app, clock
    app.close()


def test_advancing_the_clock_runs_a_delayed_task_and_a_retry_without_waiting(
    clocked: tuple[conveyor.App, testing.FakeClock],
) -> None:
    app, clock = clocked
    started = time.monotonic()
    tries: list[int] = []

    @app.task
    def remind(who: str) -> str:
        return f"reminded {who}"

    @app.task(retry=conveyor.RetryPolicy(max_attempts=3, initial_interval=600, jitter=0.1))
    def flaky() -> str:
        tries.append(1)
        if len(tries) == 1:
            raise ValueError("first try fails")
        return "ok"

    later = remind.options(delay=3600).enqueue(who="ada")
    assert app.get(later.id).run_at == clock.now() + timedelta(hours=1)  # type: ignore[union-attr]
    assert testing.drain(app) == 0
    clock.advance(3599)
    assert testing.drain(app) == 0
    clock.advance(1)
    assert testing.drain(app) == 1
    assert later.result(timeout=1) == "reminded ada"

    retried = flaky.enqueue()
    assert testing.drain(app) == 1
    assert app.get(retried.id).state is conveyor.TaskState.PENDING  # type: ignore[union-attr]
    clock.advance(timedelta(minutes=11))  # past 600 s + 10 % jitter
    assert testing.drain(app) == 1
    assert retried.result(timeout=1) == "ok"
    assert time.monotonic() - started < 20  # an hour and more of task time, not of waiting
    attempts = app.get(retried.id).attempts  # type: ignore[union-attr]
    assert attempts[0].started_at == datetime(2030, 1, 1, 1, tzinfo=UTC)  # the clock's time
    assert attempts[1].started_at == attempts[0].started_at + timedelta(minutes=11)


@dataclass
class Wait:
    order: int

    async def run(self, ctx: conveyor.TaskContext) -> conveyor.Next:
        return conveyor.next(Ship(self.order), delay=timedelta(days=2))


@dataclass
class Ship:
    order: int

    async def run(self, ctx: conveyor.TaskContext) -> conveyor.Done:
        return conveyor.done(f"shipped {self.order}")


def test_coroutine_sleeps_and_workflow_step_delays_follow_the_clock(
    clocked: tuple[conveyor.App, testing.FakeClock],
) -> None:
    app, clock = clocked
    orders = app.workflow("orders")
    orders.step(Wait)
    orders.step(Ship)

    @app.coroutine("nap")
    async def nap(poll: conveyor.Poll) -> conveyor.Sleep | conveyor.Done:
        if poll.state.get("slept"):
            return conveyor.done("awake")
        poll.state["slept"] = True
        return conveyor.sleep(timedelta(hours=8))

    flow = orders.start(Wait(order=7))
    napping = nap.start({})
    assert testing.drain(app) == 2  # the first step, the first poll
    assert testing.drain(app) == 0
    clock.advance(timedelta(hours=8))
    assert testing.drain(app) == 1
    assert napping.result(timeout=1) == "awake"
    clock.advance(timedelta(days=2))
    assert testing.drain(app) == 1
    assert flow.result(timeout=1) == "shipped 7"


def test_a_standing_clock_expires_no_lease_however_long_a_handler_runs(
    clocked: tuple[conveyor.App, testing.FakeClock],
) -> None:
    app, _ = clocked

    @app.task(lease=0.5)
    def slow() -> str:
        time.sleep(0.8)  # longer than its lease: the heartbeat renews it meanwhile
        return "done"

    handle = slow.enqueue()
    assert testing.drain(app) == 1
    task = app.get(handle.id)
    assert task is not None
    assert [a.outcome for a in task.attempts] == [conveyor.Outcome.SUCCEEDED]


def test_leases_follow_the_clock_a_lease_moved_past_is_lost_and_the_task_runs_again(
    clocked: tuple[conveyor.App, testing.FakeClock],
) -> None:
    app, clock = clocked
    runs: list[int] = []

    @app.task
    def slow(ctx: conveyor.TaskContext) -> int:
        runs.append(ctx.attempt)
        if ctx.attempt == 1:
            clock.advance(3600)  # "an hour later": the lease has run out meanwhile
        return ctx.attempt

    handle = slow.enqueue()
    assert testing.drain(app) == 2
    task = app.get(handle.id)
    assert task is not None
    assert [a.outcome for a in task.attempts] == [
        conveyor.Outcome.LEASE_LOST,
        conveyor.Outcome.SUCCEEDED,
    ]
    assert handle.result(timeout=1) == 2


# -- what is enqueued -------------------------------------------------------------


@dataclass
class Address:
    city: str


def test_enqueued_lists_pending_tasks_oldest_first_with_their_arguments(
    app: conveyor.App,
) -> None:
    @app.task
    def mail(to: str, subject: str = "hello", where: Address | None = None) -> None: ...

    @app.task
    def other() -> None: ...

    assert testing.enqueued(mail) == []
    app.enqueue_many(mail, [{"to": f"user{i}"} for i in range(130)])
    other.enqueue()
    found = testing.enqueued(mail)
    assert [t.payload["to"] for t in found] == [f"user{i}" for i in range(130)]  # two pages
    assert all(t.state is conveyor.TaskState.PENDING for t in found)

    mail.enqueue(to="ada", where=Address("Paris"))
    first = testing.assert_enqueued(mail, to="user0")
    assert first.id == found[0].id
    testing.assert_enqueued(mail, to="user1", subject="hello")  # the handler's default
    testing.assert_enqueued(mail, where=Address("Paris"))  # as JSON, as stored
    testing.assert_enqueued(mail)
    testing.assert_not_enqueued(mail, to="bob")
    testing.assert_not_enqueued(mail, to="user1", subject="bye")
    with pytest.raises(AssertionError, match=r"expected no pending task 'mail' with to='ada'"):
        testing.assert_not_enqueued(mail, to="ada")
    assert testing.drain(app) == 132
    testing.assert_not_enqueued(mail)


def test_assert_enqueued_says_what_was_enqueued_instead(app: conveyor.App) -> None:
    @app.task
    def mail(to: str) -> None: ...

    with pytest.raises(AssertionError) as empty:
        testing.assert_enqueued(mail, to="ada")
    assert str(empty.value) == (
        "no task 'mail' with to='ada' is pending; the store holds no task 'mail'"
    )
    mail.enqueue(to="bob")
    mail.options(delay=60).enqueue(to="eve")
    with pytest.raises(AssertionError) as wrong:
        testing.assert_enqueued(mail, to="ada")
    lines = str(wrong.value).splitlines()
    assert lines[0] == "no pending task 'mail' with to='ada'"
    assert lines[1] == "pending tasks of 'mail' (2):"
    assert lines[2].startswith("  #1 {'to': 'bob'} (run_at ")
    assert lines[3].startswith("  #2 {'to': 'eve'} (run_at ")
    assert len(lines) == 4
    assert testing.drain(app) == 1
    with pytest.raises(AssertionError) as ran:
        testing.assert_enqueued(mail, to="bob")
    assert str(ran.value).splitlines()[-1] == "tasks of 'mail' not pending: 1 succeeded"
    app.cancel(2)
    with pytest.raises(AssertionError) as none:
        testing.assert_enqueued(mail)
    assert str(none.value) == (
        "no task 'mail' is pending; tasks of 'mail' not pending: 1 cancelled, 1 succeeded"
    )


# -- calling a task directly --------------------------------------------------------


async def test_calling_a_task_calls_its_handler_directly() -> None:
    app = conveyor.App(f"memory://{uuid.uuid4().hex}")

    @app.task
    def add(a: int, b: int) -> int:
        return a + b

    @app.task
    async def greet(name: str, ctx: conveyor.TaskContext) -> str:
        return f"hello {name} from attempt {ctx.attempt}"

    orders = app.workflow("orders")
    orders.step(Ship)

    assert add(1, b=2) == 3
    ctx = conveyor.TaskContext(1, "greet", "default", 1, "test")
    assert await greet(name="ada", ctx=ctx) == "hello ada from attempt 1"
    assert app.list_tasks() == []  # nothing was enqueued
    with pytest.raises(TypeError, match=r"<Workflow orders .*> is not called directly"):
        orders(ctx, {"order": 1})
    assert await Ship(order=1).run(ctx) == conveyor.done("shipped 1")
    app.close()


# -- time libraries ---------------------------------------------------------------


@pytest.mark.timeout(30)
def test_a_drain_under_freezegun_s_frozen_time_raises_instead_of_hanging() -> None:
    freezegun = pytest.importorskip("freezegun")
    app = conveyor.App(f"memory://{uuid.uuid4().hex}")
    inline = conveyor.App(f"memory://{uuid.uuid4().hex}?inline=true")

    @app.task
    def ping() -> None: ...

    @inline.task
    def pong() -> None: ...

    with freezegun.freeze_time("2030-01-01"):
        ping.enqueue()
        with pytest.raises(conveyor.ConfigurationError, match="FakeClock"):
            testing.drain(app)
        with pytest.raises(conveyor.ConfigurationError, match="freeze_time"):
            pong.enqueue()  # stored, but not run
    with freezegun.freeze_time("2030-01-01", tick=True) as frozen:
        assert testing.drain(app) == 1  # a running clock works
        ping.options(delay=60).enqueue()
        frozen.tick(61)  # the memory store reads freezegun's datetime
        assert testing.drain(app) == 1
    app.close()
    inline.close()


@pytest.mark.timeout(30)
async def test_drain_async_under_freezegun_s_frozen_time_raises_too() -> None:
    freezegun = pytest.importorskip("freezegun")
    app = conveyor.App(f"memory://{uuid.uuid4().hex}")

    @app.task
    async def ping() -> None: ...

    await ping.enqueue_async()
    with (
        freezegun.freeze_time("2030-01-01"),
        pytest.raises(conveyor.ConfigurationError, match="conveyor_clock"),
    ):
        await testing.drain_async(app)
    assert await testing.drain_async(app) == 1
    await app.aclose()


@pytest.mark.timeout(30)
def test_time_machine_works_and_moves_the_memory_store_s_time() -> None:
    time_machine = pytest.importorskip("time_machine")
    app = conveyor.App(f"memory://{uuid.uuid4().hex}")

    @app.task
    def ping() -> str:
        return "pong"

    with time_machine.travel(datetime(2030, 1, 1, tzinfo=UTC), tick=False) as traveller:
        handle = ping.options(delay=3600).enqueue()
        assert testing.drain(app) == 0
        traveller.shift(3600)
        assert testing.drain(app) == 1
        assert handle.result(timeout=1) == "pong"
    app.close()


def test_a_drain_fires_the_schedules_the_clock_made_due(
    clocked: tuple[conveyor.App, testing.FakeClock],
) -> None:
    app, clock = clocked
    ticks: list[str] = []

    @app.task
    def tick(label: str) -> str:
        ticks.append(label)
        return label

    app.schedule(tick, every=60, args={"label": "minute"})
    assert testing.drain(app) == 0  # the schedule starts now: its first slot is ahead
    clock.advance(61)
    assert testing.drain(app) == 1
    assert testing.drain(app) == 0  # a slot fires once
    clock.advance(120)
    assert testing.drain(app) == 1  # missed="latest": the latest slot, once
    assert ticks == ["minute", "minute"]


def doubling(app: conveyor.App) -> tuple[conveyor.TaskDef, conveyor.TaskDef]:
    """A task that doubles, and a chord's callback that adds up its members' results."""

    @app.task
    def double(n: int) -> int:
        return 2 * n

    @app.task
    def total(outcomes: list[dict[str, object]]) -> int:
        return sum(o["result"] for o in outcomes)  # type: ignore[misc]

    return double, total


def test_a_drain_runs_a_chord_and_a_chain_to_their_end(
    clocked: tuple[conveyor.App, testing.FakeClock],
) -> None:
    app, _clock = clocked

    double, total = doubling(app)

    chord = conveyor.chord([double.s(n=n) for n in range(5)], total.s().receiving("outcomes"))
    handle = chord.enqueue()
    chained = conveyor.chain(double.s(n=1), double.s().receiving("n")).enqueue()
    assert testing.drain(app) == 8
    assert handle.result(timeout=1) == 20
    assert chained.result(timeout=1) == 4


def test_inline_mode_runs_a_chord_before_the_enqueue_returns() -> None:
    app = conveyor.App(f"memory://{uuid.uuid4().hex}?inline=true")

    double, total = doubling(app)

    handle = conveyor.chord([double.s(n=n) for n in range(3)], total.s().receiving("outcomes"))
    stored = handle.enqueue()
    assert app.get(stored.callback.id).state is conveyor.TaskState.SUCCEEDED  # type: ignore[union-attr]
    assert stored.result(timeout=1) == 6
    app.close()
