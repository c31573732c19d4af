"""Hand-offs to a worker process that freezes (SIGSTOP) while it offers
slots: the tasks handed to it run once, on another worker, after their
lease; when it thaws and hears their notices, it starts none of them (its
trust in each lease counts from the database clock, not from the notice)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

import conveyor
from tests.cli_harness import ROOT
from tests.conftest import PG_URL

pytestmark = pytest.mark.slow
LEASE = "2"


def start_worker(schema: str, log: Path, *options: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "CONVEYOR_URL": PG_URL, "CONVEYOR_SCHEMA": schema}
    command = [sys.executable, "-m", "conveyor.cli", "worker", "tests.apps.ledger:app"]
    with log.open("w") as out:
        return subprocess.Popen(
            [*command, "--lease", LEASE, "--no-schedules", "--no-prune", *options],
            cwd=ROOT,
            env=env,
            stderr=out,
        )


def wait_until(check: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_hand_offs_to_a_frozen_worker_run_once_elsewhere_and_never_when_it_thaws(
    schema: str, tmp_path: Path
) -> None:
    app = conveyor.App(PG_URL, schema=schema, allow_unregistered=True)
    app.migrate()
    ledger = tmp_path / "ledger"
    frozen = start_worker(schema, tmp_path / "frozen.log", "--concurrency", "4")
    other = None
    try:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            offered = f"select coalesce(sum(free), 0) from {schema}.standby where until > now()"

            def offering() -> bool:
                row = conn.execute(offered).fetchone()
                return row is not None and row[0] == 2

            wait_until(offering)
            frozen.send_signal(signal.SIGSTOP)
            handles = [app.enqueue("work", {"n": n, "ledger": str(ledger)}) for n in range(2)]
            ids = [h.id for h in handles]
            rows = conn.execute(
                f"select state, attempt from {schema}.tasks where id = any(%s) order by id",
                (ids,),
            ).fetchall()
            assert rows == [("in_progress", 1), ("in_progress", 1)]  # handed to the frozen one
        other = start_worker(
            schema, tmp_path / "other.log", "--no-handoffs", "--poll-interval", "0.2"
        )
        assert [h.result(timeout=60) for h in handles] == [0, 1]
        frozen.send_signal(signal.SIGCONT)
        time.sleep(3)  # it hears the notices now, and must start nothing
        runs = Counter(int(line.split()[0]) for line in ledger.read_text().splitlines())
        assert runs == Counter({ids[0]: 1, ids[1]: 1})
        for task_id in ids:
            task = app.get(task_id)
            assert task is not None and task.state is conveyor.TaskState.SUCCEEDED
            assert [a.outcome.value for a in task.attempts] == ["lease_lost", "succeeded"]
        assert "came too late to trust its lease" in (tmp_path / "frozen.log").read_text()
    finally:
        frozen.send_signal(signal.SIGCONT)
        for worker in (frozen, other):
            if worker is not None:
                worker.send_signal(signal.SIGTERM)
                try:
                    assert worker.wait(timeout=60) == 0
                finally:
                    if worker.poll() is None:
                        worker.kill()
        app.close()
