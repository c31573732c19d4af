"""The handler processes of ``process=True`` tasks: reused between attempts,
one per running attempt, and killed alone when their attempt must stop."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

import conveyor
from conveyor import ConfigurationError, Outcome, RetryPolicy, TaskState
from conveyor.cli import main as cli_main
from conveyor.worker.executors import ProcessExecution
from conveyor.worker.processes import ProcessPool
from tests.apps import cpu
from tests.worker.helpers import RunningWorker, run_all, wait_terminal
from tests.worker.orphans import alive, outlives_its_worker

ROOT = Path(__file__).resolve().parents[2]
ONCE = RetryPolicy(max_attempts=1)


@pytest.fixture
def app() -> Iterator[conveyor.App]:
    """The pool does not depend on the store: the memory backend."""
    application = conveyor.App(f"memory://{uuid.uuid4().hex}")
    yield application
    application.close()


async def _gone(pid: int, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while alive(pid) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    return not alive(pid)


async def test_attempts_reuse_one_process(app: conveyor.App) -> None:
    pid_of = app.task(name="pid_of_process", process=True)(cpu.pid_of_process)
    async with app, RunningWorker(app, concurrency=1) as worker:
        handles = [await pid_of.enqueue_async() for _ in range(5)]
        tasks = await wait_terminal(app, [h.id for h in handles])
        assert worker.processes.started == 1
        assert worker.processes.idle == 1
    assert [t.state for t in tasks] == [TaskState.SUCCEEDED] * 5
    pids = {t.result for t in tasks}
    assert len(pids) == 1
    [pid] = pids
    assert pid != os.getpid()
    # The worker's stop ends its idle handler processes.
    assert await _gone(pid)


async def test_process_pool_zero_starts_a_process_per_attempt(app: conveyor.App) -> None:
    pid_of = app.task(name="pid_of_process", process=True)(cpu.pid_of_process)
    async with app:
        handles = [await pid_of.enqueue_async() for _ in range(3)]
        tasks = await run_all(app, handles, concurrency=1, process_pool=0)
    assert len({t.result for t in tasks}) == 3
    for pid in {t.result for t in tasks}:
        assert isinstance(pid, int)
        assert await _gone(pid)


async def test_running_attempts_never_share_a_process(app: conveyor.App) -> None:
    sleeper = app.task(name="sleep_then_pid", process=True)(cpu.sleep_then_pid)
    async with app, RunningWorker(app, concurrency=3, process_pool=1) as worker:
        handles = [await sleeper.enqueue_async(seconds=1.0) for _ in range(3)]
        tasks = await wait_terminal(app, [h.id for h in handles])
        # Three at once: three processes; the pool keeps one of them after.
        assert worker.processes.started == 3
        assert worker.processes.idle == 1
        started: list[float] = [t.attempts[0].started_at.timestamp() for t in tasks]
        ended = [t.attempts[0].finished_at for t in tasks]
    assert len({t.result for t in tasks}) == 3
    assert all(e is not None for e in ended)
    # They ran side by side, not one after another.
    assert max(started) - min(started) < 1.0


async def test_a_timed_out_attempt_kills_its_process_only(app: conveyor.App) -> None:
    pid_of = app.task(name="pid_of_process", process=True)(cpu.pid_of_process)
    sleeper = app.task(name="sleep_then_pid", process=True, timeout=0.5, retry=ONCE)(
        cpu.sleep_then_pid
    )
    async with app, RunningWorker(app, concurrency=1) as worker:
        [first] = await wait_terminal(app, [(await pid_of.enqueue_async()).id])
        reused = first.result
        assert isinstance(reused, int)
        [slow] = await wait_terminal(app, [(await sleeper.enqueue_async(seconds=60)).id])
        # The process the timed-out attempt ran in was the pool's one: it is
        # killed, and the next attempt starts a fresh process.
        assert await _gone(reused)
        [after] = await wait_terminal(app, [(await pid_of.enqueue_async()).id])
        assert worker.processes.started == 2
    assert slow.state is TaskState.FAILED
    assert slow.attempts[0].outcome is Outcome.TIMED_OUT
    assert isinstance(after.result, int) and after.result != reused


async def test_a_crashed_process_is_replaced(app: conveyor.App) -> None:
    crash = app.task(name="crash_process", process=True, retry=ONCE)(cpu.crash_process.fn)
    pid_of = app.task(name="pid_of_process", process=True)(cpu.pid_of_process)
    async with app, RunningWorker(app, concurrency=1) as worker:
        [before] = await wait_terminal(app, [(await pid_of.enqueue_async()).id])
        [crashed] = await wait_terminal(app, [(await crash.enqueue_async()).id])
        [after] = await wait_terminal(app, [(await pid_of.enqueue_async()).id])
        assert worker.processes.started == 2
    assert crashed.state is TaskState.FAILED
    assert "exited with code 3" in (crashed.attempts[0].error_message or "")
    assert before.result != after.result


async def test_a_handler_that_exits_fails_its_attempt_and_its_process_serves_on(
    app: conveyor.App,
) -> None:
    exits = app.task(name="exit_then_pid", process=True, retry=ONCE)(cpu.exit_then_pid)
    pid_of = app.task(name="pid_of_process", process=True)(cpu.pid_of_process)
    async with app, RunningWorker(app, concurrency=1) as worker:
        [exited] = await wait_terminal(app, [(await exits.enqueue_async(code=4)).id])
        [after] = await wait_terminal(app, [(await pid_of.enqueue_async()).id])
        assert worker.processes.started == 1
    assert exited.state is TaskState.FAILED
    assert exited.attempts[0].error_type == "SystemExit"
    assert after.state is TaskState.SUCCEEDED


async def test_a_stop_after_the_answer_leaves_the_reused_process_alone() -> None:
    pool = ProcessPool(1)
    try:
        execution = ProcessExecution(pool, "tests.apps.cpu", "pid_of_process", "{}", 1 << 20)
        pid = await execution.wait()
        assert pool.idle == 1
        # A late order to stop (a cancel that raced the answer): the process
        # went back to the pool and may serve another attempt by now.
        execution.stop()
        await asyncio.sleep(0.2)
        assert alive(pid)
        second = ProcessExecution(pool, "tests.apps.cpu", "pid_of_process", "{}", 1 << 20)
        assert await second.wait() == pid
    finally:
        await pool.close()
    assert await _gone(pid)


def test_process_pool_is_checked() -> None:
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(ConfigurationError, match="process_pool"):
            conveyor.WorkerConfig(process_pool=bad)  # type: ignore[arg-type]
    assert conveyor.WorkerConfig(process_pool=0).kept_processes() == 0
    assert conveyor.WorkerConfig().kept_processes() == (os.cpu_count() or 1)


def test_the_cli_takes_a_process_pool() -> None:
    result = CliRunner().invoke(cli_main, ["worker", "--help"])
    assert "--process-pool" in result.output
    bad = CliRunner().invoke(cli_main, ["worker", "tests.apps.cpu:app", "--process-pool", "-1"])
    assert bad.exit_code == 2


# An idle handler process (its attempt done, kept for the next) must die
# with its worker too: nothing else would ever end it.
_IDLE_SCRIPT = """
import asyncio, time
from conveyor.worker.executors import ProcessExecution
from conveyor.worker.processes import ProcessPool

async def main():
    pool = ProcessPool(1)
    execution = ProcessExecution(pool, "tests.apps.cpu", "pid_of_process", "{}", 1 << 20)
    print(await execution.wait(), flush=True)
    time.sleep(60)

asyncio.run(main())
"""


def test_an_idle_handler_process_dies_with_its_worker() -> None:
    assert not outlives_its_worker(_IDLE_SCRIPT), (
        "an idle handler process still runs 10 s after its worker was killed"
    )
