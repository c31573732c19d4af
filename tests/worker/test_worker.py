"""The worker in this process, on every backend: outcomes, stops, fencing.

Attempt transactions (PostgreSQL only) are in test_transactions.py.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

import conveyor
from conveyor import Outcome, RetryPolicy, TaskContext, TaskState
from conveyor.backends.params import FinishParams
from tests.apps import cpu
from tests.worker.helpers import (
    RunningWorker,
    listening,
    run_all,
    steal,
    wait_for,
    wait_terminal,
)

FAST = RetryPolicy(max_attempts=3, initial_interval=0.01, max_interval=0.01, jitter=0)


@pytest.fixture
def app(any_app: conveyor.App) -> conveyor.App:
    """Every test here runs on each backend."""
    return any_app


async def test_async_handler_result_is_stored(app: conveyor.App) -> None:
    @app.task()
    async def add(a: int, b: int) -> int:
        return a + b

    async with app:
        handle = await add.enqueue_async(a=2, b=3)
        [task] = await run_all(app, [handle])
        assert await handle.result_async(timeout=1) == 5
    assert task.state is TaskState.SUCCEEDED
    assert [(a.number, a.outcome) for a in task.attempts] == [(1, Outcome.SUCCEEDED)]
    assert task.attempts[0].finished_at is not None


async def test_sync_handler_runs_in_a_thread(app: conveyor.App) -> None:
    seen: list[str] = []

    @app.task()
    def where() -> str:
        seen.append(threading.current_thread().name)
        return "done"

    async with app:
        [task] = await run_all(app, [await where.enqueue_async()])
    assert task.result == "done"
    assert seen and seen[0] != threading.main_thread().name


async def test_failures_retry_by_policy_then_fail_with_traceback(app: conveyor.App) -> None:
    calls: list[int] = []

    @app.task(retry=FAST)
    async def flaky(ctx: TaskContext) -> None:
        calls.append(ctx.attempt)
        raise ValueError(f"bad attempt {ctx.attempt}")

    async with app:
        [task] = await run_all(app, [await flaky.enqueue_async()])
    assert calls == [1, 2, 3]
    assert task.state is TaskState.FAILED
    assert [a.outcome for a in task.attempts] == [Outcome.FAILED] * 3
    last = task.attempts[-1]
    assert last.error_type == "ValueError"
    assert last.error_message == "bad attempt 3"
    assert last.traceback is not None and "in flaky" in last.traceback


async def test_retry_then_success(app: conveyor.App) -> None:
    @app.task(retry=FAST)
    async def second_time(ctx: TaskContext) -> int:
        if ctx.attempt < 2:
            raise RuntimeError("not yet")
        return ctx.attempt

    async with app:
        [task] = await run_all(app, [await second_time.enqueue_async()])
    assert task.result == 2
    assert [a.outcome for a in task.attempts] == [Outcome.FAILED, Outcome.SUCCEEDED]


async def test_fatal_skips_retries(app: conveyor.App) -> None:
    @app.task(retry=FAST)
    async def doomed() -> None:
        raise conveyor.Fatal("never works")

    async with app:
        [task] = await run_all(app, [await doomed.enqueue_async()])
    assert task.state is TaskState.FAILED
    assert len(task.attempts) == 1


async def test_async_timeout_stops_the_handler(app: conveyor.App) -> None:
    cancelled = asyncio.Event()

    @app.task(timeout=0.2, retry=RetryPolicy(max_attempts=1))
    async def slow() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async with app:
        [task] = await run_all(app, [await slow.enqueue_async()])
    assert cancelled.is_set()
    assert task.state is TaskState.FAILED
    assert task.attempts[0].outcome is Outcome.TIMED_OUT


async def test_thread_timeout_holds_the_slot_until_the_handler_stops(app: conveyor.App) -> None:
    stopped_at: list[float] = []

    @app.task(timeout=0.2, retry=RetryPolicy(max_attempts=1))
    def cooperative(ctx: TaskContext) -> None:
        ctx.wait_for_stop(30)
        time.sleep(0.3)  # cleaning up after the order to stop
        stopped_at.append(time.monotonic())
        ctx.check()

    async with app:
        handle = await cooperative.enqueue_async()
        async with RunningWorker(app, concurrency=1) as worker:
            [task] = await wait_terminal(app, [handle.id])
            assert worker.running == []
    assert stopped_at, "the handler saw the order to stop"
    assert task.attempts[0].outcome is Outcome.TIMED_OUT
    # Recorded only once the thread had really returned.
    assert task.attempts[0].finished_at is not None


async def test_cancel_a_running_task(app: conveyor.App) -> None:
    started = asyncio.Event()
    stopped = asyncio.Event()

    @app.task()
    async def forever() -> None:
        started.set()
        try:
            await asyncio.sleep(60)
        finally:
            stopped.set()

    async with app:
        handle = await forever.enqueue_async()
        async with RunningWorker(app, lease=1.0):
            await asyncio.wait_for(started.wait(), 10)
            assert await app.cancel_async(handle.id) is TaskState.IN_PROGRESS
            [task] = await wait_terminal(app, [handle.id], timeout=5)
    assert stopped.is_set()
    assert task.state is TaskState.CANCELLED
    assert task.attempts[0].outcome is Outcome.CANCELLED


async def test_cancelled_running_task_is_not_run_again_after_it_fails(app: conveyor.App) -> None:
    calls: list[int] = []
    started = asyncio.Event()
    proceed = asyncio.Event()

    @app.task(retry=FAST)
    async def flaky(ctx: TaskContext) -> str:
        calls.append(ctx.attempt)
        if ctx.attempt == 1:
            started.set()
            await proceed.wait()
            raise ValueError("failed after the cancel was accepted")
        return "ran again after being cancelled"

    async with app:
        handle = await flaky.enqueue_async()
        # Default lease (30 s): the heartbeat beats every 10 s, i.e. not in this window.
        async with RunningWorker(app):
            await asyncio.wait_for(started.wait(), 10)
            assert await app.cancel_async(handle.id) is TaskState.IN_PROGRESS
            proceed.set()
            [task] = await wait_terminal(app, [handle.id], timeout=5)
    assert calls == [1], f"handler ran {len(calls)} times after cancel"
    assert task.state is TaskState.CANCELLED


async def test_cancel_pending_task_never_runs(app: conveyor.App) -> None:
    ran: list[int] = []

    @app.task()
    async def never() -> None:
        ran.append(1)

    async with app:
        handle = await never.enqueue_async()
        assert await app.cancel_async(handle.id) is TaskState.CANCELLED
        async with RunningWorker(app):
            await asyncio.sleep(0.3)
        task = await handle.get_async()
    assert ran == []
    assert task.state is TaskState.CANCELLED
    with pytest.raises(conveyor.TaskFailedError):
        await handle.result_async(timeout=1)


async def test_lost_lease_stops_the_handler_and_its_late_write_changes_nothing(
    app: conveyor.App,
) -> None:
    started = asyncio.Event()
    stopped = asyncio.Event()

    @app.task()
    async def victim() -> str:
        started.set()
        try:
            await asyncio.sleep(60)
        finally:
            stopped.set()
        return "victim"

    async with app:
        handle = await victim.enqueue_async()
        async with RunningWorker(app, lease=1.0, poll_interval=30) as worker:
            await asyncio.wait_for(started.wait(), 10)
            await wait_for(lambda: listening(worker), timeout=10)
            completion = await steal(app, handle.id, "thief")
            await asyncio.wait_for(stopped.wait(), 5)
        backend = await app.backend()
        assert completion is not None
        done = await backend.finish(FinishParams("thief", [completion]))
        assert done.applied == {completion.token}
        task = await handle.get_async()
    assert task.state is TaskState.SUCCEEDED
    assert task.result == "thief"
    assert [(a.number, a.outcome) for a in task.attempts] == [
        (1, Outcome.LEASE_LOST),
        (2, Outcome.SUCCEEDED),
    ]
    assert task.attempts[1].worker_id == "thief"


@pytest.mark.slow
@pytest.mark.parametrize(
    "task_def", [cpu.spin_in_thread, cpu.spin_in_process], ids=["thread", "process"]
)
async def test_cpu_bound_handler_for_three_leases_is_not_reclaimed(
    app: conveyor.App, task_def: conveyor.TaskDef
) -> None:
    # Two-second leases: a heartbeat is bounded by a third of the lease, and
    # with one-second leases a single 330 ms stall of a loaded CI machine
    # (seen once) made the worker give up a lease the handler still held.
    registered = app.task(name=task_def.name, process=task_def.executor == "process", lease=2.0)(
        task_def.fn
    )
    async with app:
        handle = await registered.enqueue_async(seconds=6.0)
        [task] = await run_all(app, [handle], lease=2.0)
    assert task.state is TaskState.SUCCEEDED, task.attempts
    assert [a.outcome for a in task.attempts] == [Outcome.SUCCEEDED]


async def test_process_handler_that_dies_fails_the_attempt(app: conveyor.App) -> None:
    registered = app.task(name="crash_process", process=True, retry=RetryPolicy(max_attempts=1))(
        cpu.crash_process.fn
    )
    async with app:
        [task] = await run_all(app, [await registered.enqueue_async()])
    assert task.state is TaskState.FAILED
    assert "exited with code 3" in (task.attempts[0].error_message or "")


async def test_bad_handlers_never_kill_the_worker(app: conveyor.App) -> None:
    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    once = RetryPolicy(max_attempts=1)

    @app.task(retry=once)
    async def exits() -> None:
        raise SystemExit(3)

    @app.task(retry=once)
    def interrupts() -> None:
        raise KeyboardInterrupt

    @app.task(retry=once)
    async def unprintable() -> None:
        raise Unprintable

    @app.task(retry=once)
    async def not_json() -> object:
        return {1, 2}

    @app.task(retry=once)
    async def huge_error() -> None:
        raise ValueError("x" * 10_000_000)

    @app.task()
    async def fine() -> str:
        return "fine"

    async with app:
        handles = [
            await t.enqueue_async()
            for t in (exits, interrupts, unprintable, not_json, huge_error, fine)
        ]
        tasks = await run_all(app, handles)
    *bad, good = tasks
    assert good.result == "fine"
    assert all(t.state is TaskState.FAILED for t in bad)
    types = [t.attempts[0].error_type for t in bad]
    assert types[:2] == ["SystemExit", "KeyboardInterrupt"]
    assert "Unprintable" in (bad[2].attempts[0].error_message or "")
    assert "not a JSON type" in (bad[3].attempts[0].error_message or "")
    assert len(bad[4].attempts[0].error_message or "") <= 4_000


async def test_enqueue_rejects_bad_input_before_any_io(app: conveyor.App) -> None:
    @app.task()
    async def typed(a: int, note: str = "") -> None:
        return None

    with pytest.raises(conveyor.PayloadError, match="does not fit"):
        await typed.enqueue_async(b=1)
    with pytest.raises(conveyor.PayloadError, match="argument 'a' expects int"):
        await typed.enqueue_async(a="1")
    with pytest.raises(conveyor.PayloadError):
        await typed.enqueue_async(a=float("nan"))
    with pytest.raises(conveyor.PayloadTooLargeError):
        await typed.enqueue_async(a=1, note="x" * (1024 * 1024))
    with pytest.raises(conveyor.UnknownTaskError):
        await app.enqueue_async("nope", {})
    with pytest.raises(conveyor.DuplicateTaskError):
        app.task(name="typed")(lambda: None)
    assert not app._backends  # no backend was ever opened


async def test_sync_api_from_plain_code(app: conveyor.App) -> None:
    @app.task()
    async def mul(a: int, b: int) -> int:
        return a * b

    handle = await asyncio.to_thread(mul.enqueue, a=6, b=7)
    async with app:
        await run_all(app, [handle])
    assert await asyncio.to_thread(handle.result, 5) == 42
    assert (await asyncio.to_thread(app.get, handle.id)).state is TaskState.SUCCEEDED  # type: ignore[union-attr]


async def test_idle_worker_wakes_on_enqueue_without_polling(app: conveyor.App) -> None:
    @app.task()
    async def ping() -> str:
        return "pong"

    async with app:
        await app.backend()
        async with RunningWorker(app, poll_interval=120) as worker:
            await wait_for(lambda: listening(worker), timeout=10)
            handle = await ping.enqueue_async()
            # Far less than the poll interval: only a notification can explain it.
            [task] = await wait_terminal(app, [handle.id], timeout=30)
    assert task.state is TaskState.SUCCEEDED


async def test_an_attempt_that_never_waits_ends_at_its_start_on_python_3_12() -> None:
    """On Python 3.12+ an attempt's runner starts eagerly: a handler that
    never waits has ended when its runner is returned; before 3.12 the runner
    waits for a turn of the event loop."""
    import sys

    from conveyor.worker.producer import _start_runner

    steps: list[str] = []

    async def quick() -> None:
        steps.append("ran")

    runner = _start_runner(quick(), asyncio.get_running_loop())
    assert runner.done() is (sys.version_info >= (3, 12))
    await runner
    assert steps == ["ran"]


async def test_ended_attempts_leave_nothing_in_the_worker(app: conveyor.App) -> None:
    """Attempts that end at once (eagerly, on Python 3.12+) and attempts that
    wait both leave the worker's runner set; none is kept after its end."""

    @app.task()
    async def instant() -> None:
        return None

    @app.task()
    async def napping() -> None:
        await asyncio.sleep(0.01)

    handles = [await instant.enqueue_async() for _ in range(20)]
    handles += [await napping.enqueue_async() for _ in range(20)]
    async with RunningWorker(app, concurrency=8) as worker:
        tasks = await wait_terminal(app, [h.id for h in handles])
        await wait_for(lambda: _no_runners(worker))
        assert worker._running == {}
    assert [t.state for t in tasks] == [TaskState.SUCCEEDED] * len(handles)


async def _no_runners(worker: conveyor.Worker) -> bool:
    return not worker._runners
