"""The chaos smoke profile: real worker processes under faults, checked offline.

Each case runs ``tools.chaos.harness.run`` with the smoke profile (2000
tasks, 4 workers of 4 slots, 2 s leases, faults until the work is done) in a
fresh store, then asserts the checker found no breach: nothing lost, no
stale write accepted, no unexplained duplicate, no duplicate at all in the
control run, every reclaim within lease + poll interval + 1 s. The kill, stop,
term and net (PostgreSQL only: a TCP proxy resets or black-holes the
workers' connections) cases must also show that their fault happened and
was survived.
"""

from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path

import pytest

from tests.conftest import PG_URL
from tools.chaos.harness import NETWORK_SCENARIOS, SMOKE, run

pytestmark = pytest.mark.timeout(600)


def _store(backend: str, tmp_path: Path) -> tuple[str, str | None]:
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'chaos.db'}", None
    return PG_URL, f"chaos_{uuid.uuid4().hex[:8]}"


CASES = [
    (backend, scenario)
    for backend in ("postgres", "sqlite")
    for scenario in ("control", "kill", "stop", "term", "net")
    if not (backend == "sqlite" and scenario in NETWORK_SCENARIOS)
]


@pytest.mark.parametrize(("backend", "scenario"), CASES)
async def test_smoke(backend: str, scenario: str, tmp_path: Path) -> None:
    url, schema = _store(backend, tmp_path)
    lines: list[str] = []
    report = await run(url, scenario, tmp_path / "run", SMOKE, schema=schema, log=lines.append)
    assert report.ok, report.summary() + "\n" + "\n".join(lines)
    assert report.enqueued == report.terminal == SMOKE.tasks
    assert report.lost == 0 and report.stale_writes_accepted == 0
    if scenario == "control":
        assert report.duplicates == 0 and report.reclaims == 0
    if scenario == "kill":
        assert report.worker_restarts > 0 and report.reclaims > 0
        assert report.worst_reclaim_seconds is not None
        assert report.worst_reclaim_seconds <= SMOKE.lease + SMOKE.poll_interval + 1
    if scenario == "stop":
        # A worker stopped for twice its lease loses what it held; when it
        # wakes, its late endings are refused.
        assert report.stale_writes_rejected > 0
        if backend == "postgres":
            assert report.reclaims > 0
        # On SQLite the stopped process may hold the single write lock: every
        # worker freezes with it, their leases expire too, and the stopped
        # worker's own tasks may end before anyone reclaims them (so its
        # reclaims can be 0; the refused late endings show the fault).
    if scenario == "term":
        assert report.worker_restarts > 0
    if scenario == "net":
        # Cut and swallowed connections cost leases; their late endings are refused.
        assert report.stale_writes_rejected > 0
    if backend == "sqlite":
        conn = sqlite3.connect(tmp_path / "chaos.db")
        try:
            assert conn.execute("pragma integrity_check").fetchone() == ("ok",)
        finally:
            conn.close()
