"""Real worker processes: killed, drained, released, and crashing on every
attempt; and a process handler, which dies with its killed worker.

Each test that starts ``conveyor worker`` runs on PostgreSQL, SQLite and Redis.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

import conveyor
from conveyor import Outcome, RetryPolicy, Task, TaskState
from tests.conftest import REDIS_URL, drop_redis_prefix, schema_for
from tests.worker.orphans import outlives_its_worker

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.apps.lifecycle:app"
FAST = ("--poll-interval", "0.1")


class Workers:
    """Starts ``conveyor worker`` processes and kills whatever is left at the end."""

    def __init__(self, url: str, schema: str, logs: Path) -> None:
        self.env = {**os.environ, "CONVEYOR_URL": url, "CONVEYOR_SCHEMA": schema}
        self.logs = logs
        self.started: list[subprocess.Popen[bytes]] = []

    def start(self, *args: str) -> subprocess.Popen[bytes]:
        log = self.logs / f"worker-{len(self.started)}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "conveyor.cli", "worker", APP, *FAST, *args],
                cwd=ROOT,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.started.append(proc)
        return proc

    def log(self, proc: subprocess.Popen[bytes]) -> str:
        path = self.logs / f"worker-{self.started.index(proc)}.log"
        return path.read_text(errors="replace")

    def wait(self, proc: subprocess.Popen[bytes], timeout: float) -> int:
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"worker still running after {timeout}s:\n{self.log(proc)}")

    def kill_all(self) -> None:
        for proc in self.started:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


@pytest.fixture(params=["postgres", "sqlite", "redis"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def url(kind: str, pg_url: str, tmp_path: Path) -> str:
    if kind == "redis":
        return REDIS_URL
    return pg_url if kind == "postgres" else f"sqlite:///{tmp_path / 'tasks.db'}"


@pytest.fixture
def store_schema(kind: str, request: pytest.FixtureRequest) -> Iterator[str]:
    """The PostgreSQL schema, or the Redis key prefix (its keys deleted after)."""
    name = schema_for(kind, request)
    yield name
    if kind == "redis":
        drop_redis_prefix(name)


@pytest.fixture
def workers(url: str, store_schema: str, tmp_path: Path) -> Iterator[Workers]:
    group = Workers(url, store_schema, tmp_path)
    try:
        yield group
    finally:
        group.kill_all()


@pytest.fixture
def client(url: str, store_schema: str) -> Iterator[conveyor.App]:
    application = conveyor.App(url, schema=store_schema, allow_unregistered=True)
    yield application
    application.close()


def wait_until(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def get(client: conveyor.App, task_id: int) -> Task:
    task = client.get(task_id)
    assert task is not None
    return task


def outcomes(task: Task) -> list[Outcome]:
    return [a.outcome for a in task.attempts]


def marks(marker: Path) -> list[int]:
    """The attempt numbers whose handler started (see tests/apps/lifecycle.py)."""
    return [int(line) for line in marker.read_text().split()] if marker.exists() else []


def spent(url: str, schema: str, task_id: int) -> int:
    """The task's crash-budget counter, read around the client (it is not public)."""
    if url.startswith("redis"):
        import redis

        with contextlib.closing(redis.Redis.from_url(url)) as client:
            return int(client.hget(f"{{{schema}}}:task:{task_id}", "spent"))  # type: ignore[arg-type]
    if url.startswith("sqlite:///"):
        with contextlib.closing(sqlite3.connect(url.removeprefix("sqlite:///"))) as lite:
            found = lite.execute("select spent from conveyor_tasks where id = ?", (task_id,))
            row = found.fetchone()
    else:
        query = sql.SQL("select spent from {}.tasks where id = %s").format(sql.Identifier(schema))
        with psycopg.connect(url) as conn:
            row = conn.execute(query, (task_id,)).fetchone()
    assert row is not None
    return int(row[0])


def running_attempt_one(client: conveyor.App, task_id: int, marker: Path) -> bool:
    task = get(client, task_id)
    return (
        marks(marker) == [1]
        and task.state is TaskState.IN_PROGRESS
        and outcomes(task) == [Outcome.IN_PROGRESS]
    )


def test_sigkill_mid_task_is_reclaimed_and_completed_once(
    client: conveyor.App, workers: Workers, tmp_path: Path
) -> None:
    marker = tmp_path / "marker"
    task_id = client.enqueue("hang_first", {"marker": str(marker)}).id
    first = workers.start("--lease", "1")
    wait_until(lambda: running_attempt_one(client, task_id, marker), 15, "attempt 1 to run")

    os.kill(first.pid, signal.SIGKILL)
    assert workers.wait(first, 10) == -signal.SIGKILL

    second = workers.start("--lease", "1")
    task = wait_until(
        lambda: (t := get(client, task_id)).state.is_terminal and t, 15, "the task to finish"
    )
    assert task.state is TaskState.SUCCEEDED, workers.log(second)
    assert task.result == 2
    assert outcomes(task) == [Outcome.LEASE_LOST, Outcome.SUCCEEDED]
    assert outcomes(task).count(Outcome.SUCCEEDED) == 1
    lost, won = task.attempts
    assert lost.error_type == "LeaseExpired"
    assert lost.finished_at is not None
    assert won.worker_id != lost.worker_id
    assert marks(marker) == [1, 2]

    second.send_signal(signal.SIGTERM)
    assert workers.wait(second, 10) == 0


def test_sigterm_drains_a_running_task(
    client: conveyor.App, workers: Workers, tmp_path: Path
) -> None:
    marker = tmp_path / "marker"
    task_id = client.enqueue("nap", {"marker": str(marker), "seconds": 1.0}).id
    proc = workers.start("--grace", "5")
    wait_until(lambda: running_attempt_one(client, task_id, marker), 15, "the task to run")

    proc.send_signal(signal.SIGTERM)
    assert workers.wait(proc, 10) == 0, workers.log(proc)

    task = get(client, task_id)
    assert task.state is TaskState.SUCCEEDED
    assert task.result == "rested"
    assert outcomes(task) == [Outcome.SUCCEEDED]
    [info] = client.list_workers()
    assert info.pid == proc.pid
    assert info.stopped_at is not None


def test_sigterm_past_the_grace_releases_without_burning_an_attempt(
    url: str, store_schema: str, client: conveyor.App, workers: Workers, tmp_path: Path
) -> None:
    marker = tmp_path / "marker"
    task_id = client.enqueue("long_nap", {"marker": str(marker), "seconds": 30.0}).id
    proc = workers.start("--grace", "0.5")
    wait_until(lambda: running_attempt_one(client, task_id, marker), 15, "the task to run")

    signalled = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert workers.wait(proc, 10) == 0, workers.log(proc)
    assert time.monotonic() - signalled < 5

    task = get(client, task_id)
    assert task.state is TaskState.PENDING
    assert task.worker_id is None
    assert outcomes(task) == [Outcome.INTERRUPTED]
    assert task.attempts[0].error_type == "Interrupted"
    assert spent(url, store_schema, task_id) == 0

    again = workers.start("--burst")
    assert workers.wait(again, 20) == 0, workers.log(again)
    task = get(client, task_id)
    assert task.state is TaskState.SUCCEEDED
    assert task.result == "resumed"
    assert outcomes(task) == [Outcome.INTERRUPTED, Outcome.SUCCEEDED]
    assert spent(url, store_schema, task_id) == 1
    assert marks(marker) == [1, 2]


@pytest.mark.parametrize("name", ["long_nap", "wait_for_stop"])
def test_a_cancel_reaches_a_worker_process_long_before_its_next_heartbeat(
    client: conveyor.App, workers: Workers, tmp_path: Path, name: str
) -> None:
    """From another process (the client), on PostgreSQL (NOTIFY) and SQLite
    (the file watch): the worker's lease of 90 s renews every 30 s, and the
    cancel must stop the handler well before that."""
    marker = tmp_path / "marker"
    task_id = client.enqueue(name, {"marker": str(marker), "seconds": 120.0}).id
    proc = workers.start("--lease", "90")
    wait_until(lambda: running_attempt_one(client, task_id, marker), 15, "the task to run")

    assert client.cancel(task_id) is TaskState.IN_PROGRESS
    task = wait_until(
        lambda: (t := get(client, task_id)).state.is_terminal and t, 10, "the cancel to land"
    )
    assert task.state is TaskState.CANCELLED, workers.log(proc)
    assert outcomes(task) == [Outcome.CANCELLED]
    proc.send_signal(signal.SIGTERM)
    assert workers.wait(proc, 20) == 0, workers.log(proc)


def test_a_task_that_kills_every_worker_fails_on_its_crash_budget(
    client: conveyor.App, workers: Workers, tmp_path: Path
) -> None:
    marker = tmp_path / "marker"
    task_id = client.enqueue("crash", {"marker": str(marker)}, retry=RetryPolicy(max_attempts=2)).id
    exit_codes = []
    for _ in range(6):
        proc = workers.start("--burst", "--lease", "1")
        exit_codes.append(workers.wait(proc, 20))
        if get(client, task_id).state.is_terminal:
            break

    task = get(client, task_id)
    assert task.state is TaskState.FAILED
    assert exit_codes == [1, 1, 0]
    assert marks(marker) == [1, 2]
    assert outcomes(task) == [Outcome.LEASE_LOST, Outcome.LEASE_LOST]
    assert all(a.finished_at is not None for a in task.attempts)
    last = task.attempts[-1]
    assert last.error_message is not None
    assert "crash budget" in last.error_message
    assert "2 of 2" in last.error_message
    assert task.finished_at is not None


def test_sigkill_mid_step_reruns_that_step_never_a_committed_one(
    client: conveyor.App, workers: Workers, tmp_path: Path
) -> None:
    from tests.apps.lifecycle import Depart, journey

    marker = tmp_path / "marker"

    def journal() -> list[str]:
        return marker.read_text().splitlines() if marker.exists() else []

    [handle] = client.enqueue_new([journey.new_workflow(Depart(str(marker)))])
    for hung in ("Depart 1", "Arrive 3"):
        proc = workers.start("--lease", "1")
        wait_until(lambda h=hung: h in journal(), 20, f"{hung} to run")  # type: ignore[misc]
        time.sleep(0.3)  # the step is inside its handler, its lease alive
        os.kill(proc.pid, signal.SIGKILL)
        assert workers.wait(proc, 10) == -signal.SIGKILL

    last = workers.start("--lease", "1")
    task = wait_until(
        lambda: (t := get(client, handle.id)).state.is_terminal and t, 20, "the journey to end"
    )
    assert task.state is TaskState.SUCCEEDED, workers.log(last)
    assert task.result == "arrived"
    # Depart ran again after the kill inside it; once its transition
    # committed it never ran again, though Arrive was then killed too.
    assert journal() == ["Depart 1", "Depart 2", "Arrive 3", "Arrive 4"]
    assert [(a.step, a.outcome) for a in task.attempts] == [
        ("Depart", Outcome.LEASE_LOST),
        ("Depart", Outcome.SUCCEEDED),
        ("Arrive", Outcome.LEASE_LOST),
        ("Arrive", Outcome.SUCCEEDED),
    ]
    last.send_signal(signal.SIGTERM)
    assert workers.wait(last, 10) == 0


def test_sigkill_mid_poll_repolls_the_same_state_and_inbox_never_a_committed_poll(
    client: conveyor.App, workers: Workers, tmp_path: Path
) -> None:
    from tests.apps.lifecycle import ledger, relay

    marker = tmp_path / "marker"

    def journal() -> list[str]:
        return marker.read_text().splitlines() if marker.exists() else []

    [ledger_handle] = client.enqueue_new([ledger.new_coroutine({"got": []})])
    sink = ledger_handle.id
    state = {"marker": str(marker), "ledger": sink, "seen": []}
    [handle] = client.enqueue_new([relay.new_coroutine(state, "a")])
    task_id = handle.id
    # Poll 1 consumes "a", tells the ledger and commits before any kill.
    first = workers.start("--burst")
    assert workers.wait(first, 20) == 0, workers.log(first)
    assert get(client, task_id).state is TaskState.WAITING
    assert journal() == ["1:  | a"]

    client.send(task_id, "b")
    client.send(task_id, "c")
    hung = workers.start("--lease", "1")
    wait_until(lambda: "2: a | b c" in journal(), 20, "poll 2 to run")
    time.sleep(0.3)  # the poll is inside its handler, its lease alive
    os.kill(hung.pid, signal.SIGKILL)
    assert workers.wait(hung, 10) == -signal.SIGKILL
    # The killed poll consumed nothing; its send and spawn never happened.
    assert [m.body for m in client.inbox(task_id)] == ["b", "c"]
    assert client.inbox(sink) == []
    client.send(task_id, "d")

    last = workers.start("--lease", "1")
    task, told = wait_until(
        lambda: (
            (t := get(client, task_id)).state.is_terminal
            and (s := get(client, sink)).state.is_terminal
            and (t, s)
        ),
        20,
        "the relay and its ledger to end",
    )
    assert task.state is TaskState.SUCCEEDED, workers.log(last)
    assert task.result == ["a", "b", "c", "d"]
    # Poll 2 ran again from poll 1's state, with the same messages and "d";
    # poll 1, committed before the kill, never ran again.
    assert journal() == ["1:  | a", "2: a | b c", "3: a | b c d"]
    assert outcomes(task) == [Outcome.SUCCEEDED, Outcome.LEASE_LOST, Outcome.SUCCEEDED]
    lost = task.attempts[1]
    assert lost.error_type == "LeaseExpired"
    assert lost.finished_at is not None
    assert lost.worker_id != task.attempts[2].worker_id
    # Each committed poll's send arrived once: none from the killed one.
    assert told.state is TaskState.SUCCEEDED, workers.log(last)
    assert told.result == [["a"], ["b", "c", "d"]]
    assert client.inbox(task_id) == [] and client.inbox(sink) == []
    assert [t.id for t in client.list_tasks(limit=1000) if t.parent_id == task_id] == []

    last.send_signal(signal.SIGTERM)
    assert workers.wait(last, 10) == 0


# A process handler once outlived its worker: after a SIGKILL (OOM killer,
# kill -9, node drain) the forkserver child kept running its handler,
# although its lease would expire and another worker would run the task again
# -- two live executions of the same task, which self-fencing exists to
# prevent (a process handler is "terminated", contract point 4).

_ORPHAN_SCRIPT = """
import asyncio
from conveyor.worker.executors import ProcessExecution
from conveyor.worker.processes import ProcessPool

async def main():
    # Exactly what the worker does for a process=True task.
    execution = ProcessExecution(
        ProcessPool(2), "tests.apps.cpu", "spin_in_process", '{"seconds": 60}', 1 << 20)
    print(execution.process.pid, flush=True)
    await execution.wait()

asyncio.run(main())
"""


def test_process_handler_dies_with_its_worker() -> None:
    assert not outlives_its_worker(_ORPHAN_SCRIPT), (
        "the handler process still runs 10 s after its worker was killed"
    )
