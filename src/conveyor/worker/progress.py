"""Progress reports: the latest report of each running attempt, written in
batches at most once per interval.

A handler's ``ctx.progress(...)`` only records its latest value here (from
any thread); a loop on the worker's event loop writes every attempt's
pending report in one fenced call (``Backend.report_progress``), then waits
out the interval before the next. So a handler that reports a million times
a second costs one write per interval, and a worker whose handlers report
nothing costs nothing. When an attempt ends, its pending report (if any)
is written before its completion, so the last value reported is the one
stored.

Reports are hints: a write that fails (the store away, a timeout) is
dropped, logged once per outage, and not retried; the next report of the
same attempt is written at the next interval. A report whose lease is lost
is not stored (the store's fence).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable
from typing import TypeAlias

from conveyor.backends.params import ClaimedTask, ProgressParams, ProgressReport
from conveyor.backends.protocol import Backend
from conveyor.backends.stored import progress_text
from conveyor.model import LeaseToken
from conveyor.worker.stopping import cancel_and_wait
from conveyor.worker.texts import reason

log = logging.getLogger("conveyor.worker.progress")

Reported: TypeAlias = tuple[int, int | None, str | None]
"""A report as the handler gave it: done, total, note (checked)."""


class ProgressReporter:
    """Start/stop component; ``flush_once`` writes what is pending (for tests)."""

    def __init__(
        self,
        backend: Backend,
        worker_id: str,
        interval: float,
        on_stored: Callable[[ClaimedTask, Reported], None],
        timeout: float,
    ) -> None:
        self._backend = backend
        self._worker_id = worker_id
        self._interval = interval
        self._on_stored = on_stored
        self._timeout = timeout
        self._pending: dict[LeaseToken, tuple[ClaimedTask, Reported]] = {}
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._failing = False
        self._writing: asyncio.Future[None] | None = None
        self._writing_tokens: frozenset[LeaseToken] = frozenset()
        self.writes = 0
        """Calls of ``report_progress`` made (for tests and the benchmark)."""

    def sink(self, task: ClaimedTask) -> Callable[[int, int | None, str | None], None]:
        """The function the TaskContext of ``task``'s attempt reports through."""

        def report(done: int, total: int | None, note: str | None) -> None:
            with self._lock:
                first = not self._pending
                self._pending[task.token] = (task, (done, total, note))
            if first:
                self._wake()

        return report

    def _wake(self) -> None:
        loop, ready = self._loop, self._ready
        if loop is None or ready is None:
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            ready.set()
        else:
            with contextlib.suppress(RuntimeError):  # the loop closed: the worker is gone
                loop.call_soon_threadsafe(ready.set)

    def owes(self, token: LeaseToken) -> bool:
        """Whether ``token``'s attempt has a report not yet stored (pending,
        or in the write under way): then :meth:`last` must run before its
        completion is written."""
        return token in self._pending or token in self._writing_tokens

    async def last(self, token: LeaseToken) -> None:
        """``token``'s attempt ended: let the write under way that carries
        its report end, then write its pending report, if any (each bounded
        by the timeout; a failure drops it). Its completion is written after
        this, so the last report is stored under the lease still."""
        if self._writing is not None and token in self._writing_tokens:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._writing)
        with self._lock:
            pending = self._pending.pop(token, None)
        if pending is not None:
            await self._write([pending])

    def forget(self, token: LeaseToken) -> None:
        """Drop ``token``'s pending report unwritten (its lease is gone)."""
        with self._lock:
            self._pending.pop(token, None)

    async def flush_once(self) -> None:
        """Write every pending report, in one call."""
        with self._lock:
            batch, self._pending = list(self._pending.values()), {}
        if not batch:
            return
        self._writing_tokens = frozenset(task.token for task, _ in batch)
        self._writing = asyncio.ensure_future(self._write(batch))
        try:
            await asyncio.shield(self._writing)
        finally:
            self._writing, self._writing_tokens = None, frozenset()

    async def _write(self, batch: list[tuple[ClaimedTask, Reported]]) -> None:
        self.writes += 1
        reports = [
            ProgressReport(task.token, progress_text(*values, task.token.attempt))
            for task, values in batch
        ]
        params = ProgressParams(self._worker_id, reports)
        try:
            async with asyncio.timeout(self._timeout):
                stored = await self._backend.report_progress(params)
        except Exception as exc:
            if not self._failing:
                log.warning("progress reports were not stored: %s", reason(exc))
            self._failing = True
            return
        self._failing = False
        for task, values in batch:
            if task.token in stored:
                self._on_stored(task, values)

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._ready = asyncio.Event()
        self._task = self._loop.create_task(self._run(), name="conveyor-progress")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None

    async def _run(self) -> None:
        assert self._ready is not None
        while True:
            await self._ready.wait()
            self._ready.clear()
            await self.flush_once()
            await asyncio.sleep(self._interval)
