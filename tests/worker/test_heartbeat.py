"""The heartbeat component: self-fencing when renewals cannot get through."""

from __future__ import annotations

import threading
import time

from conveyor.backends.postgres import PostgresBackend
from conveyor.backends.protocol import HeartbeatResult
from conveyor.model import LeaseToken
from conveyor.worker.heartbeat import Heartbeat, HeartbeatConfig

UNREACHABLE = "postgresql://127.0.0.1:1/nowhere?connect_timeout=1"


def _heartbeat(reports: list[HeartbeatResult], lease: float = 1.0) -> Heartbeat:
    return Heartbeat(
        HeartbeatConfig(worker_id="w", lease=lease),
        lambda: PostgresBackend(UNREACHABLE, migrate=False, pool_size=1),
        reports.append,
    )


def test_leases_near_their_end_are_fenced_and_fresh_ones_kept() -> None:
    reports: list[HeartbeatResult] = []
    beat = _heartbeat(reports, lease=3.0)
    old, fresh = LeaseToken(1, 1, "w"), LeaseToken(2, 1, "w")
    now = time.monotonic()
    beat.hold(old, 3.0, sent_at=now - 2.5)  # half a second of trust left
    beat.hold(fresh, 3.0, sent_at=now)
    assert beat.fence_untrusted() == {old}
    assert beat.held() == [fresh]
    assert reports == [HeartbeatResult(frozenset(), frozenset({old}), frozenset())]


def test_unreachable_database_self_fences_every_lease() -> None:
    reports: list[HeartbeatResult] = []
    beat = _heartbeat(reports)
    token = LeaseToken(1, 1, "w")
    beat.hold(token, 1.0, sent_at=time.monotonic())
    beat.start()
    try:
        deadline = time.monotonic() + 15
        while not reports and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        beat.stop()
    assert reports, "the lease was never given up"
    assert reports[0].lost == {token}
    assert beat.beats == 0
    assert beat.held() == []
    assert not any(t.name == "conveyor-heartbeat" and t.is_alive() for t in threading.enumerate())
