"""The chaos smoke profile: real worker processes under faults, checked offline.

Each case runs ``tools.chaos.harness.run`` with the smoke profile (1200
plain tasks, 60 three-step workflows, 20 coroutines that gather 5 children
and 4 outside messages each, 40 chords of 10 members and a callback; 4
workers of 4 slots, 2 s leases, faults until the work is done) in a fresh
store, then asserts the checker found no breach: nothing lost, no stale
write accepted, no unexplained duplicate, no step re-run after its
transition committed, every message consumed exactly once, every chord's
callback run once after its last member ended, with every member's result
in order, no duplicate at all in the control run, every reclaim within
lease + poll interval + 1 s. The kill, stop, term, net (PostgreSQL and Redis: a TCP
proxy resets or black-holes the workers' connections), restart (PostgreSQL:
immediate restarts of the local server; Redis: SIGKILL and restart of a
server of the run's own, ``appendfsync always``) and gil cases must also
show that their fault happened and was survived. The Redis data-loss run
(``wipe``: a server without persistence restarted empty under running
workers) has a checker of its own (:mod:`tools.chaos.wipe`).
"""

from __future__ import annotations

import os
import sqlite3
import uuid
from pathlib import Path

import pytest

from tests.conftest import PG_URL
from tools.chaos.app import CPU_PROCESS_NAME, CPU_THREAD_NAME
from tools.chaos.harness import SCENARIOS, SERVER_ONLY, SMOKE, redis_store, run
from tools.chaos.wipe import forgetful_store, run_wipe
from tools.redis_server import RedisServer

pytestmark = pytest.mark.timeout(600)


def _store(backend: str, tmp_path: Path) -> tuple[str, str | None, RedisServer | None]:
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'chaos.db'}", None, None
    if backend == "redis":
        server = redis_store(tmp_path)
        return server.url, "chaos", server
    return PG_URL, f"chaos_{uuid.uuid4().hex[:8]}", None


DEFAULT = {
    "postgres": {"kill", "stop", "net", "restart", "bouncer"},
    "sqlite": {"kill", "stop", "gil"},
    "redis": {"kill", "stop", "net", "restart"},
}
"""The scenarios each backend runs by default (kept under CI's time budget):
every one whose fault reaches the store (its connections, leases, locks and
persistence) on every backend that has it, and the GIL-holding handler
(``gil``) on one. ``CONVEYOR_CHAOS=full`` runs every scenario on every
backend that can run it, with those that exercise the worker process alone
(``term``: a drain on SIGTERM; ``control``: no fault, and so no duplicate
at all): run it before a release, and for any change to the worker's
shutdown, its claims or its completions."""
FULL = os.environ.get("CONVEYOR_CHAOS") == "full"
CASES = [
    (backend, scenario)
    for backend in ("postgres", "sqlite", "redis")
    for scenario in SCENARIOS
    if not (backend == "sqlite" and scenario in SERVER_ONLY)
    and (FULL or scenario in DEFAULT[backend])
]


LOG_TAIL = 40
"""Lines of each worker's log a failed case shows (its last ones)."""


def _worker_logs(run: Path) -> list[str]:
    """The end of every worker's log, so a failed case shows what its workers said."""
    shown = []
    for path in sorted(run.glob("worker-*.log"), key=lambda p: int(p.stem.split("-")[1])):
        tail = path.read_text(errors="replace").splitlines()[-LOG_TAIL:]
        shown += [f"--- {path.name} (last {len(tail)} lines)", *tail]
    return shown


@pytest.mark.parametrize(("backend", "scenario"), CASES)
async def test_smoke(backend: str, scenario: str, tmp_path: Path) -> None:
    url, schema, server = _store(backend, tmp_path)
    lines: list[str] = []
    try:
        report = await run(
            url, scenario, tmp_path / "run", SMOKE, schema=schema, log=lines.append, redis=server
        )
    finally:
        if server is not None:
            server.stop()
    hung = [f.read_text() for f in sorted((tmp_path / "run").glob("hung-*.txt"))]
    assert report.ok, "\n".join([report.summary(), *lines, *hung, *_worker_logs(tmp_path / "run")])
    assert report.enqueued == report.terminal == report.succeeded
    assert report.enqueued >= SMOKE.tasks + SMOKE.flows + SMOKE.gathers
    assert report.names["chaos_gather"].tasks == SMOKE.gathers
    assert report.names["chaos_collect"].tasks == SMOKE.chords
    assert report.lost == 0 and report.stale_writes_accepted == 0
    if scenario == "control":
        assert report.duplicates == 0 and report.reclaims == 0
    if scenario == "kill":
        assert report.worker_restarts > 0 and report.reclaims > 0
        assert report.worst_reclaim_seconds is not None
        assert report.worst_reclaim_seconds <= SMOKE.lease + SMOKE.poll_interval + 1
    if scenario == "stop":
        # A worker stopped for twice its lease loses what it held. When it
        # wakes, either its late completions are refused by the store, or its
        # heartbeat finds the leases lost first and stops those handlers
        # before they write (both are the fence at work; which comes first
        # depends on whether a beat or a handler runs first after the wake).
        assert report.stale_writes_rejected + report.handlers_stopped > 0, report.summary()
        if backend == "postgres":
            assert report.reclaims > 0
        # On SQLite the stopped process may hold the single write lock: every
        # worker freezes with it, their leases expire too, and the stopped
        # worker's own tasks may end before anyone reclaims them (so its
        # reclaims can be 0; the refused late completions show the fault).
    if scenario == "term":
        assert report.worker_restarts > 0
    if scenario == "net":
        # Cut and swallowed connections cost leases; their late completions are refused.
        assert report.stale_writes_rejected > 0
    if scenario == "restart":
        restarts = (tmp_path / "run" / "database.jsonl").read_text().count('"restart"')
        assert restarts >= 1
    if scenario == "bouncer":
        restarts = (tmp_path / "run" / "bouncer.jsonl").read_text().count('"restart"')
        assert restarts >= 1
    if scenario == "gil":
        # A thread handler holding the GIL for three leases freezes its worker:
        # its lease is lost and its late completion refused, then it runs again.
        # In a process executor the worker's heartbeat keeps the lease.
        thread, process = report.names[CPU_THREAD_NAME], report.names[CPU_PROCESS_NAME]
        assert thread.tasks == process.tasks == SMOKE.cpu_tasks
        assert thread.lease_lost >= thread.tasks and report.stale_writes_rejected > 0
        assert process.attempts == process.tasks and process.lease_lost == 0
    if backend == "sqlite":
        conn = sqlite3.connect(tmp_path / "chaos.db")
        try:
            assert conn.execute("pragma integrity_check").fetchone() == ("ok",)
        finally:
            conn.close()


async def test_redis_restart_with_data_loss(tmp_path: Path) -> None:
    """The ``wipe`` run (:mod:`tools.chaos.wipe`): a Redis server without
    persistence restarted empty, twice, under running workers with
    attempts in flight, and tasks enqueued after each restart reusing the
    forgotten tasks' ids. No attempt ever completes a task it was not
    claimed for; what the last round enqueued all succeeds; every live
    worker is registered again."""
    server = forgetful_store(tmp_path)
    try:
        report = await run_wipe(server, tmp_path / "run")
    finally:
        server.stop()
    assert report.ok, "\n".join([report.summary(), *_worker_logs(tmp_path / "run")])
    assert report.wrong_completions == [] and report.lost_after_last_wipe == []
