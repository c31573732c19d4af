"""A ``conveyor worker`` process exits within its grace and stop timeout
(plus a bounded last write) after SIGTERM, even while a completion it
cannot write is pending: whether the store refuses that completion and
answers otherwise (the completion is then recorded as a failure), or looks
away (every write of the worker's fails, the heartbeat's too, while its
leases are still trusted: the completion is given up, and the task's lease
will expire). The store refuses with SQLSTATE 08006, a connection failure,
raised by triggers the test adds to its own schema: the worker cannot tell
it from a lost connection by its class."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

import conveyor
from conveyor import TaskState
from tests.apps.refusals import build
from tests.cli_harness import ROOT
from tests.conftest import PG_URL

pytestmark = pytest.mark.slow

LEASE = 90.0
"""Long: before it is up, a worker whose leases are trusted would still retry."""
GRACE = 1.0
STOP_TIMEOUT = 10.0
"""The worker's default (the command has no option for it)."""
LAST_WRITES = 5.0
MARGIN = 10.0
"""Generous: the bound is an order, not a timing."""


def refuse(schema: str, table: str, when: str) -> None:
    """A trigger on ``table`` of the test's schema that raises a connection
    failure (08006) before each row write matching ``when``."""
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "create or replace function {s}.refuse() returns trigger language plpgsql as $$"
                " begin raise exception 'refused by the test' using errcode = '08006'; end $$"
            ).format(s=sql.Identifier(schema))
        )
        conn.execute(
            sql.SQL(
                "create trigger {name} before insert or update on {s}.{t} for each row"
                " when ({when}) execute function {s}.refuse()"
            ).format(
                name=sql.Identifier(f"refuse_{table}"),
                s=sql.Identifier(schema),
                t=sql.Identifier(table),
                when=sql.SQL(when),  # the test's own constant text
            )
        )


def start_worker(schema: str, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "CONVEYOR_URL": PG_URL, "CONVEYOR_SCHEMA": schema}
    command = [sys.executable, "-m", "conveyor.cli", "worker", "tests.apps.refusals:app"]
    options = ["--lease", str(LEASE), "--grace", str(GRACE), "--poll-interval", "0.1"]
    with log.open("w") as out:
        return subprocess.Popen(
            [*command, *options, "--no-schedules", "--no-prune", "--concurrency", "64"],
            cwd=ROOT,
            env=env,
            stderr=out,
        )


def wait_until(check: Callable[[], bool], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


@pytest.mark.parametrize("store", ["answers", "away"])
def test_sigterm_ends_a_worker_whose_completion_cannot_be_written(
    schema: str, tmp_path: Path, store: str
) -> None:
    app = build(conveyor.App(PG_URL, schema=schema))
    app.migrate()
    refuse(schema, "tasks", "new.queue = 'refused'")
    marker = tmp_path / "marker"
    log = tmp_path / "worker.log"
    plain, spawner = app.tasks["plain"], app.tasks["spawner"]
    worker = start_worker(schema, log)
    try:
        neighbours = [plain.enqueue(n=n) for n in range(60)]  # type: ignore[attr-defined]
        assert [h.result(timeout=60) for h in neighbours] == list(range(60))
        if store == "away":  # the heartbeat's writes fail from now on
            refuse(schema, "workers", "true")
        poll = spawner.start({"marker": str(marker)})  # type: ignore[attr-defined]
        wait_until(marker.exists)
        time.sleep(1)  # its completion is refused, and retried or split
        worker.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        try:
            worker.wait(timeout=GRACE + STOP_TIMEOUT + LAST_WRITES + MARGIN)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the worker still runs {time.monotonic() - sent:.0f}s after SIGTERM")
        assert worker.returncode == 0, log.read_text()[-3000:]
        task = poll.get()
        if store == "answers":
            # Recorded as a failure of its attempt, with the store's reason.
            assert task.state is TaskState.FAILED
            [attempt] = task.attempts
            assert attempt.error_type == "CompletionRefused"
            assert attempt.error_message is not None
            assert "refused by the test" in attempt.error_message
        else:
            # Given up: in progress until its lease expires, then reclaimed.
            assert task.state is TaskState.IN_PROGRESS
            assert "completions were not written" in log.read_text()
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        app.close()
