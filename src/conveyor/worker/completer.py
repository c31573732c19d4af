"""Batched completions: many fenced attempt completions in one statement.

Handlers that finish together are recorded together: while one flush is in
flight, new completions queue up and go in the next one, so batches grow with
load and latency stays one round trip when idle. A failed flush is retried
until the heartbeat stops trusting the lease (then the task will be
reclaimed and the completion is dropped, as a lost lease's write must be).
A flush that has not returned after ``timeout`` seconds (a connection that
swallows packets never answers) counts as failed: it is cancelled and
retried. It may still have been applied; the retry is then refused by the
fence, and the completion is reported as not applied.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from conveyor.backends.protocol import Backend, Completion, FinishParams
from conveyor.errors import BackendUnavailableError
from conveyor.model import LeaseToken
from conveyor.worker.outage import Outage

log = logging.getLogger("conveyor.worker.completer")

RETRY_MIN_DELAY = 0.05
RETRY_MAX_DELAY = 2.0


class Completer:
    """Start/stop component; ``flush_once`` writes what is queued (for tests)."""

    def __init__(
        self,
        backend: Backend,
        worker_id: str,
        still_held: Callable[[LeaseToken], bool],
        on_recorded: Callable[[Completion, bool], None],
        timeout: float | None = None,
        outage: Outage | None = None,
    ) -> None:
        self._backend = backend
        self.outage = outage if outage is not None else Outage()
        self._timeout = timeout
        self._worker_id = worker_id
        self._still_held = still_held
        self._on_recorded = on_recorded
        self._queue: list[Completion] = []
        self._ready = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self.flushes = 0

    def submit(self, completion: Completion) -> None:
        """Queue a completion; ``on_recorded(completion, applied)`` follows its write."""
        self._queue.append(completion)
        self._idle.clear()
        self._ready.set()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="conveyor-completer")

    async def stop(self) -> None:
        """Flush everything queued, then stop."""
        self._stopping = True
        self._ready.set()
        if self._task is not None:
            await self._task

    async def wait_idle(self) -> None:
        """Return once everything submitted so far has been written."""
        await self._idle.wait()

    async def flush_once(self) -> None:
        batch, self._queue = self._queue, []
        self._ready.clear()
        await self._write(batch)

    async def _write(self, batch: list[Completion]) -> None:
        """Write ``batch``; retry while the backend is away and the leases are
        trusted; isolate a completion the backend refuses for good."""
        delay = RETRY_MIN_DELAY
        while batch:
            params = FinishParams(worker_id=self._worker_id, completions=batch)
            try:
                async with asyncio.timeout(self._timeout):
                    result = await self._backend.finish(params)
            except (BackendUnavailableError, TimeoutError) as exc:
                self.outage.failed("completion", exc)
                batch = self._still_trusted(batch)
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX_DELAY)
                continue
            except Exception:
                if len(batch) > 1:  # find the one that is refused; write the others
                    for completion in batch:
                        await self._write([completion])
                    return
                log.exception(
                    "the backend refuses to record this attempt's completion; it is dropped and "
                    "the task will be reclaimed when its lease expires",
                    extra={"task_id": batch[0].token.task_id, "attempt": batch[0].token.attempt},
                )
                self._report(batch[0], False)
                return
            self.outage.ok("completion")
            self.flushes += 1
            for completion in batch:
                self._report(completion, completion.token in result.applied)
            return

    def _still_trusted(self, batch: list[Completion]) -> list[Completion]:
        kept = []
        for completion in batch:
            if self._still_held(completion.token):
                kept.append(completion)
            else:
                self._report(completion, False)
        return kept

    def _report(self, completion: Completion, applied: bool) -> None:
        try:
            self._on_recorded(completion, applied)
        except Exception:  # a callback must not stop the flushing
            log.exception("completion callback failed")

    async def _run(self) -> None:
        while True:
            if self._queue:
                await self.flush_once()
            elif self._stopping:
                return
            else:
                self._idle.set()
                self._ready.clear()
                await self._ready.wait()
