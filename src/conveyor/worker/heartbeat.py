"""The heartbeat: renews every lease a worker holds, on its own thread.

It runs its own event loop and its own backend connection in a dedicated
thread, so nothing a handler does on the worker's loop (a busy ``async def``,
a full pool) can starve it. Each beat is one batched, fenced statement.

Self-fencing: every lease has a local trust deadline measured with
``time.monotonic()`` from the moment the claim or renewal *was sent*, so it
always ends before the database's ``lease_expires_at``. A second thread
checks those deadlines on its own timer; when renewals fail (database down,
network cut, a connection that swallows packets) and a lease has one interval
of trust left, the lease is reported lost, and the worker stops its handler
before anyone can reclaim it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from conveyor.backends.capabilities import Renewer
from conveyor.backends.params import HeartbeatParams, HeartbeatResult
from conveyor.errors import BackendUnavailableError
from conveyor.events import EventBus, LeaseLost, LeaseRenewed
from conveyor.model import LeaseToken
from conveyor.worker.config import beat_interval
from conveyor.worker.outage import Outage
from conveyor.worker.texts import reason

if TYPE_CHECKING:
    from conveyor.worker.attempt import RunningAttempt

log = logging.getLogger("conveyor.worker.heartbeat")

RETRY_DELAY = 0.2
WAKE_SLICE = 0.25


@dataclass(slots=True)
class HeldLease:
    seconds: float
    trusted_until: float
    """``time.monotonic()`` after which we no longer trust the lease."""


@dataclass(frozen=True, slots=True)
class HeartbeatConfig:
    worker_id: str
    lease: float
    """Lease seconds of tasks that do not set their own."""
    interval: float | None = None
    """Seconds between beats; default: the shortest held lease / 3."""


class Heartbeat:
    """Start/stop component; ``run_once`` does one beat (for tests)."""

    def __init__(
        self,
        config: HeartbeatConfig,
        make_backend: Callable[[], Renewer],
        on_result: Callable[[HeartbeatResult], None],
        outage: Outage | None = None,
    ) -> None:
        self.config = config
        self.outage = outage if outage is not None else Outage()
        self._make_backend = make_backend
        self._on_result = on_result
        self._leases: dict[LeaseToken, HeldLease] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._fencer: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self.beats = 0

    # -- leases ------------------------------------------------------------

    def hold(self, token: LeaseToken, seconds: float, sent_at: float) -> None:
        """Start renewing ``token``; ``sent_at`` is when the claim was sent."""
        self.hold_many([(token, seconds)], sent_at)

    def hold_many(self, leases: Iterable[tuple[LeaseToken, float]], sent_at: float) -> None:
        """Start renewing each ``(token, seconds)`` of one claim sent at ``sent_at``."""
        with self._lock:
            for token, seconds in leases:
                self._leases[token] = HeldLease(seconds, sent_at + seconds)

    def release(self, token: LeaseToken) -> None:
        with self._lock:
            self._leases.pop(token, None)

    def held(self) -> list[LeaseToken]:
        with self._lock:
            return list(self._leases)

    def interval(self) -> float:
        """Seconds between beats: the configured interval, but never more than a
        third of the shortest lease held (a task may set a shorter lease)."""
        with self._lock:
            shortest = min((h.seconds for h in self._leases.values()), default=self.config.lease)
        return beat_interval(min(shortest, self.config.lease), self.config.interval)

    # -- one beat --------------------------------------------------------------

    async def run_once(self, backend: Renewer) -> HeartbeatResult | None:
        """Renew every held lease; report the result (or the self-fenced leases)."""
        with self._lock:
            tokens = list(self._leases)
        sent_at = time.monotonic()
        params = HeartbeatParams(
            worker_id=self.config.worker_id, tokens=tokens, lease=self.config.lease
        )
        try:
            # Bounded: a call stuck on a dead connection must not hold back fencing.
            async with asyncio.timeout(self.interval()):
                result = await self._renew(backend, params)
        except Exception as exc:
            self.outage.failed("heartbeat", exc)
            self.fence_untrusted()
            return None
        self.outage.ok("heartbeat")
        self.beats += 1
        with self._lock:
            for token in result.renewed:
                held = self._leases.get(token)
                if held is not None:
                    held.trusted_until = sent_at + held.seconds
            for token in result.lost:
                self._leases.pop(token, None)
        if result.renewed or result.lost or result.cancel_requested or not result.registered:
            self._report(result)  # renewals too: the worker's events tell of them
        return result

    async def _renew(self, backend: Renewer, params: HeartbeatParams) -> HeartbeatResult:
        """One beat. A batch the store refuses (an error that does not say
        the store is away: a task's stored fields a script cannot use, say)
        is split in halves, each renewed on its own, so that one lease the
        store will not renew never costs the others theirs; that one is
        reported lost (its handler is stopped, and its task reclaimed when
        its lease expires)."""
        try:
            return await backend.heartbeat(params)
        except BackendUnavailableError:
            raise
        except Exception as exc:
            tokens = list(params.tokens)
            if not tokens:
                raise
            if len(tokens) == 1:
                [token] = tokens
                log.error(
                    "the store refuses to renew this lease (%s); it is given up",
                    reason(exc),
                    extra={"task_id": token.task_id, "attempt": token.attempt},
                )
                with contextlib.suppress(Exception):  # the worker is still seen
                    await backend.heartbeat(replace(params, tokens=[]))
                return HeartbeatResult(frozenset(), frozenset(tokens), frozenset())
        half = len(tokens) // 2
        first = await self._renew(backend, replace(params, tokens=tokens[:half]))
        second = await self._renew(backend, replace(params, tokens=tokens[half:]))
        return HeartbeatResult(
            first.renewed | second.renewed,
            first.lost | second.lost,
            first.cancel_requested | second.cancel_requested,
        )

    def fence_untrusted(self) -> frozenset[LeaseToken]:
        """Give up (report lost) every lease whose trust runs out within one interval."""
        now = time.monotonic()
        # A renewal is sent every interval and bounded by one; trust runs for
        # three: a lease still unrenewed with one interval left is given up.
        margin = self.interval()
        with self._lock:
            gone = [t for t, h in self._leases.items() if now >= h.trusted_until - margin]
            for token in gone:
                del self._leases[token]
        if gone:
            log.warning("self-fencing %d leases: renewals have failed for too long", len(gone))
            self._report(HeartbeatResult(frozenset(), frozenset(gone), frozenset()))
        return frozenset(gone)

    def _report(self, result: HeartbeatResult) -> None:
        try:
            self._on_result(result)
        except Exception:
            log.exception("heartbeat result handler failed")

    # -- thread ----------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self._main()), name="conveyor-heartbeat", daemon=True
        )
        self._thread.start()
        self._fencer = threading.Thread(target=self._fence_loop, name="conveyor-fence", daemon=True)
        self._fencer.start()

    def _fence_loop(self) -> None:
        """Check trust on a timer of its own: a renewal stuck in the network
        (a black-holed connection, a slow cancel) cannot delay self-fencing."""
        while not self._stopping.wait(min(WAKE_SLICE, self.interval() / 2)):
            self.fence_untrusted()

    def stop(self) -> None:
        self._stopping.set()
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(wake.set)
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._fencer is not None:
            self._fencer.join(timeout=10)

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        backend: Renewer | None = None
        try:
            while not self._stopping.is_set():
                if backend is None:
                    backend = await self._connect()
                if backend is None:
                    await self._sleep(RETRY_DELAY)
                    continue
                last = time.monotonic()
                await self.run_once(backend)
                # Wake in short slices: a newly held shorter lease shortens the wait,
                # and trust keeps running out even when no renewal gets through.
                while not self._stopping.is_set():
                    left = last + self.interval() - time.monotonic()
                    if left <= 0:
                        break
                    await self._sleep(min(WAKE_SLICE, left))
                    self.fence_untrusted()
        finally:
            if backend is not None:
                await backend.close()

    async def _sleep(self, seconds: float) -> None:
        assert self._wake is not None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._wake.wait()

    async def _connect(self) -> Renewer | None:
        backend = self._make_backend()
        try:
            async with asyncio.timeout(self.interval()):
                await backend.open()
        except Exception as exc:
            self.outage.failed("heartbeat", exc)
            with contextlib.suppress(Exception):
                await backend.close()
            self.fence_untrusted()
            return None
        return backend


def emit_heartbeat(
    events: EventBus,
    worker_id: str,
    result: HeartbeatResult,
    running: Mapping[LeaseToken, RunningAttempt],
) -> None:
    """Emit what a heartbeat of worker ``worker_id`` found, while ``events``
    has subscribers: LeaseRenewed for its renewals, LeaseLost for each lease
    lost (with the name and queue of its attempt if it still runs)."""
    if not events.active:
        return
    if result.renewed:
        events.emit(LeaseRenewed(worker_id, len(result.renewed)))
    for token in result.lost:
        found = running.get(token)
        name, queue = (found.task.name, found.task.queue) if found else ("", "")
        events.emit(LeaseLost(worker_id, token.task_id, token.attempt, name, queue))
