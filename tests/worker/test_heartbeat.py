"""The heartbeat: self-fencing when renewals cannot get through (an
unreachable database, a black-holed connection) and in time for a lease
shorter than the heartbeat interval; and its known limit, a thread handler
that holds the GIL."""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import threading
import time

import pytest

import conveyor
from conveyor import RetryPolicy, TaskState
from conveyor.backends.params import HeartbeatResult
from conveyor.backends.postgres import PostgresBackend
from conveyor.model import LeaseToken
from conveyor.records import WorkerInfo
from conveyor.worker.heartbeat import Heartbeat, HeartbeatConfig
from tests.worker.helpers import RunningWorker, wait_terminal

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


# An explicit heartbeat_interval was once only checked against the worker's
# default lease; a task with a shorter lease of its own was self-fenced at
# once, every attempt, until its crash budget failed it.


async def test_task_lease_shorter_than_heartbeat_interval_still_runs(app: conveyor.App) -> None:
    @app.task(lease=1.0, retry=RetryPolicy(max_attempts=1))
    async def quick() -> str:
        await asyncio.sleep(0.5)
        return "done"

    async with app:
        handle = await quick.enqueue_async()
        # Valid config: heartbeat_interval (2 s) < lease (10 s), the worker's default.
        async with RunningWorker(app, lease=10.0, heartbeat_interval=2.0):
            [task] = await wait_terminal(app, [handle.id], timeout=6)
    assert task.state is TaskState.SUCCEEDED, [
        (a.outcome.value, a.error_message) for a in task.attempts
    ]


# Self-fencing was once not bounded when the heartbeat's connection black-holes
# (network partition: packets dropped, no RST). asyncio.wait_for cancelled the
# statement after one interval but then waited for psycopg's cancellation
# clean-up (cancel_safe up to 5 s + waiting for the query up to 5 s). The
# slice loop that calls fence_untrusted was not running meanwhile, so the
# lease was given up long after the database may have handed the task to
# another worker: two live owners.


class BlackHoleProxy:
    """A TCP proxy to PostgreSQL that can silently stop forwarding (a partition)."""

    def __init__(self, target: tuple[str, int] = ("127.0.0.1", 5432)) -> None:
        self._target = target
        self._frozen = threading.Event()
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = []
        self._holes: list[socket.socket] = []
        self._lock = threading.Lock()
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(16)
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def freeze(self) -> None:
        self._frozen.set()

    def heal(self) -> None:
        """Forward again; connections accepted while frozen are dropped."""
        self._frozen.clear()
        with self._lock:
            holes, self._holes = self._holes, []
        for sock in holes:
            _close(sock)

    def _keep(self, sock: socket.socket, hole: bool = False) -> None:
        with self._lock:
            if self._closed.is_set():
                _close(sock)
            elif hole:
                self._holes.append(sock)
            else:
                self._sockets.append(sock)

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._frozen.is_set():
                self._keep(client, hole=True)  # accepted, never answered
                continue
            self._keep(client)
            try:
                upstream = socket.create_connection(self._target)
            except OSError:
                continue
            self._keep(upstream)
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    return
                while self._frozen.is_set() and not self._closed.is_set():
                    time.sleep(0.01)  # held, never delivered while frozen
                if self._closed.is_set():
                    return
                dst.sendall(data)
        except OSError:
            return

    def close(self) -> None:
        self._listener.close()
        with self._lock:
            self._closed.set()
            socks, self._sockets = self._sockets + self._holes, []
            self._holes = []
        for sock in socks:
            _close(sock)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


async def test_self_fencing_is_bounded_when_the_connection_black_holes(
    backend: PostgresBackend,
) -> None:
    proxy = BlackHoleProxy()
    url = f"postgresql://127.0.0.1:{proxy.port}/test"
    reports: list[tuple[float, HeartbeatResult]] = []
    # Registered: a heartbeat of an unknown worker reports it (to register again).
    await backend.register_worker(
        WorkerInfo(id="w", host="h", pid=1, queues=("default",), concurrency=1)
    )
    beat = Heartbeat(
        HeartbeatConfig(worker_id="w", lease=1.0),
        lambda: PostgresBackend(url, schema=backend.schema, migrate=False, pool_size=1),
        lambda result: reports.append((time.monotonic(), result)),
    )
    token = LeaseToken(1, 1, "w")
    beat.start()
    try:
        deadline = time.monotonic() + 5
        while beat.beats < 1 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert beat.beats >= 1, "the heartbeat never got through the proxy"
        proxy.freeze()  # the network partitions: nothing gets through any more
        sent_at = time.monotonic()
        beat.hold(token, 1.0, sent_at=sent_at)
        # The database lease ends at the earliest 1 s after sent_at; the worker
        # promises to have given the lease up (with one interval to spare) by then.
        while not reports and time.monotonic() < sent_at + 2.0:
            await asyncio.sleep(0.02)
        in_time = list(reports)  # what happened while the partition lasted
    finally:
        proxy.heal()  # let the stuck statement end, so the heartbeat stops quickly
        await asyncio.to_thread(beat.stop)
        proxy.close()
    assert in_time, "the lease was still trusted 2 s into a 1 s lease"
    fenced_at, result = in_time[0]
    assert result.lost == {token}
    assert fenced_at - sent_at < 1.0


# A known limit, documented in docs/guarantees.md. "Heartbeats are independent
# of handlers ... never starved by a CPU-bound handler (run them in threads)":
# the heartbeat is a thread of the same interpreter, so a thread handler
# inside one long GIL-holding C call (here a regular expression backtracking
# for ~2 s; also many C extensions) freezes renewals *and* self-fencing. The
# database lease expires while the handler runs, so another worker may take
# the task. If this test ever passes, the marker goes and the limit leaves the
# docs.


@pytest.mark.xfail(
    strict=True,
    reason="the heartbeat thread shares the GIL with thread handlers: a GIL-holding "
    "call longer than the lease starves renewals and the lease expires mid-run",
)
async def test_gil_holding_thread_handler_does_not_starve_the_heartbeat(
    app: conveyor.App,
) -> None:
    @app.task(lease=1.0, retry=RetryPolicy(max_attempts=1))
    def validate() -> str:
        re.match(r"(a+)+$", "a" * 26 + "b")  # ~2 s in one C call, GIL held
        return "valid"

    async with app:
        handle = await validate.enqueue_async()
        async with RunningWorker(app):
            [task] = await wait_terminal(app, [handle.id], timeout=10)
    assert [(a.number, a.outcome.value) for a in task.attempts] == [(1, "succeeded")]
