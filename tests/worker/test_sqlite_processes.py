"""Four worker processes on one SQLite file, one of them SIGKILLed mid-run.

Every task must complete exactly once in the attempt log, the killed
worker's attempts must end ``lease_lost`` and be run again elsewhere, every
execution in the ledger must be explained by the attempt log, and the file
must pass ``PRAGMA integrity_check``.
"""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

import conveyor
from conveyor import Outcome, TaskState

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
TASKS = 400
WORKERS = 4


def _wait_until(predicate: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def test_four_workers_one_killed_every_task_completes_exactly_once(tmp_path: Path) -> None:
    path = tmp_path / "tasks.db"
    ledger = tmp_path / "ledger"
    url = f"sqlite:///{path}"
    env = {**os.environ, "CONVEYOR_URL": url}
    client = conveyor.App(url, allow_unregistered=True)
    ids = [
        h.id
        for h in client.enqueue_many(
            "work", [{"n": n, "ledger": str(ledger)} for n in range(TASKS)]
        )
    ]
    procs: list[subprocess.Popen[bytes]] = []
    logs = [tmp_path / f"worker-{i}.log" for i in range(WORKERS)]
    try:
        for log in logs:
            with log.open("wb") as out:
                procs.append(
                    subprocess.Popen(
                        [
                            sys.executable,
                            "-m",
                            "conveyor.cli",
                            "worker",
                            "tests.apps.ledger:app",
                            "--concurrency",
                            "4",
                            "--lease",
                            "2",
                            "--poll-interval",
                            "0.1",
                        ],
                        cwd=ROOT,
                        env=env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                    )
                )

        def succeeded() -> int:
            return len(client.list_tasks(state=TaskState.SUCCEEDED, limit=TASKS))

        _wait_until(lambda: succeeded() >= TASKS // 4, 60, "a quarter of the tasks")
        victim = procs[0]

        def victim_holds_a_task() -> bool:
            # Killed while it holds a lease, or the kill tests nothing (on a
            # loaded machine the victim may start late, or sit between claims).
            running = client.list_tasks(state=TaskState.IN_PROGRESS, limit=TASKS)
            return any(f"-{victim.pid}-" in (task.worker_id or "") for task in running)

        _wait_until(victim_holds_a_task, 60, "the victim to hold a task")
        victim.send_signal(signal.SIGKILL)
        assert victim.wait(10) == -signal.SIGKILL
        _wait_until(lambda: succeeded() == TASKS, 120, "every task to succeed")
        for proc in procs[1:]:
            proc.send_signal(signal.SIGTERM)
        for proc, log in zip(procs[1:], logs[1:], strict=True):
            assert proc.wait(20) == 0, log.read_text(errors="replace")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)

    tasks = [client.get(i) for i in ids]
    client.close()
    executions = collections.Counter(
        (int(task_id), int(attempt))
        for task_id, attempt, _pid in (line.split() for line in ledger.read_text().splitlines())
    )
    lost = 0
    for n, task in enumerate(tasks):
        assert task is not None and task.state is TaskState.SUCCEEDED
        assert task.result == n
        numbers = [a.number for a in task.attempts]
        assert numbers == list(range(1, len(numbers) + 1)), numbers
        outcomes = [a.outcome for a in task.attempts]
        assert outcomes.count(Outcome.SUCCEEDED) == 1 and outcomes[-1] is Outcome.SUCCEEDED
        assert set(outcomes[:-1]) <= {Outcome.LEASE_LOST}, outcomes
        lost += len(outcomes) - 1
        # The succeeding attempt ran exactly once; a lost one at most once.
        assert executions[(task.id, task.attempt)] == 1
        assert all(executions[(task.id, a.number)] <= 1 for a in task.attempts)
    assert sum(executions.values()) >= TASKS
    assert lost >= 1, "the killed worker held no task: the kill tested nothing"
    with contextlib.closing(sqlite3.connect(path)) as conn:
        assert conn.execute("pragma integrity_check").fetchall() == [("ok",)]
        open_attempts = conn.execute(
            "select count(*) from conveyor_attempts where outcome = 'in_progress'"
        ).fetchone()
        assert open_attempts == (0,)
