"""Batched completions: many fenced attempt completions in one statement.

Handlers that finish together are recorded together: while one flush is in
flight, new completions queue up and go in the next one, so batches grow with
load and latency stays one round trip when idle. A flush that has not
returned after ``timeout`` seconds (a connection that swallows packets never
answers) counts as failed: it is cancelled and retried. It may still have
been applied; the retry is then refused by the fence, and the completion is
reported as not applied.

A failed flush is one of two things, told apart by asking the store:

- **The store is away** (the write failed, and so does a probe: the
  heartbeat's statement for no lease). The batch is written again, whole,
  with back-off, while the heartbeat trusts its leases; a completion whose
  lease is given up is dropped (its task will be reclaimed, as a lost
  lease's write must be).
- **The store refuses the write**: it failed with an error that does not
  say the store is away, or it failed ``REFUSALS`` times in a row with the
  probe answering after each (whatever class the error has: a limit of the
  store may come as a "connection" error). The batch is then split in two
  halves, each written on its own, so that one refused completion never
  holds back another. A single completion the store refuses is written
  again as a failure of its attempt without its result or effects
  (:func:`outcomes.refused`: error type ``CompletionRefused``, the store's
  reason as the message, retried by the task's policy); if that is refused
  too, it is dropped and logged, and its task waits out its lease, is
  reclaimed and charged to the crash budget. Nothing is retried for ever.

:meth:`Completer.stop` bounds the last writes: what is still unwritten
when its time is up is given up (logged), and those tasks' leases expire
and are reclaimed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from conveyor.backends.params import (
    ClaimedTask,
    Completion,
    FinishParams,
    FinishResult,
    HeartbeatParams,
)
from conveyor.backends.protocol import Backend
from conveyor.errors import BackendUnavailableError
from conveyor.model import LeaseToken
from conveyor.worker import outcomes
from conveyor.worker.outage import Outage
from conveyor.worker.stopping import cancel_and_wait
from conveyor.worker.texts import first_line, reason

log = logging.getLogger("conveyor.worker.completer")

RETRY_MIN_DELAY = 0.05
RETRY_MAX_DELAY = 2.0
REFUSALS = 3
"""Failures of one write in a row, the store answering a probe after each,
after which the write is taken as refused (not the store away)."""
PROBE_LEASE = 1.0
"""The lease a probe names; it renews nothing (it holds no token)."""


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
        self._claimed: dict[LeaseToken, ClaimedTask] = {}
        """The claimed task of each completion submitted with one (for its
        failure, should the store refuse the completion)."""
        self._unwritten = 0
        """Completions submitted and not yet reported."""
        self._ready = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._writing: list[Completion] = []
        """The batch being written now."""
        self._stale: set[LeaseToken] = set()
        """Tokens of completions being written that a newer claim holds now."""
        self.flushes = 0
        self.refused = 0
        """Completions the store refused (each written again as a failure, or dropped)."""

    def submit(self, completion: Completion, task: ClaimedTask | None = None) -> None:
        """Queue a completion; ``on_recorded(completion, applied)`` follows its
        write (or that of the failure written in its place: see the module).
        Without ``task``, a completion the store refuses is dropped."""
        self._queue.append(completion)
        self._unwritten += 1
        if task is not None:
            self._claimed[completion.token] = task
        self._idle.clear()
        self._ready.set()

    def discard(self, token: LeaseToken) -> None:
        """A newer claim holds ``token`` (the store gave it out again): the
        completions of it still queued are dropped unwritten and unreported;
        one being written now is not reported (its write is beyond recall)."""
        kept = [c for c in self._queue if c.token != token]
        dropped = len(self._queue) - len(kept)
        if dropped:
            self._queue = kept
            self._unwritten -= dropped
            self._claimed.pop(token, None)
        if any(c.token == token for c in self._writing):
            self._stale.add(token)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="conveyor-completer")

    async def stop(self, timeout: float | None = None) -> None:
        """Flush everything queued, then stop. After ``timeout`` seconds (None:
        no limit) what is still unwritten is given up: logged, never reported;
        those tasks stay in progress until their leases expire."""
        self._stopping = True
        self._ready.set()
        task = self._task
        if task is None:
            return
        done, _ = await asyncio.wait({task}, timeout=timeout)
        if done:
            return
        await cancel_and_wait(task)
        log.error(
            "%d completions were not written in the %.1fs a stop gives them (%s); "
            "their tasks stay in progress until their leases expire, then are reclaimed",
            self._unwritten,
            timeout,
            "the store is unreachable" if self.outage.down else "the store is slow",
        )
        self._queue.clear()
        self._claimed.clear()
        self._idle.set()

    async def wait_idle(self) -> None:
        """Return once everything submitted so far has been written."""
        await self._idle.wait()

    async def flush_once(self) -> None:
        batch, self._queue = self._queue, []
        self._ready.clear()
        self._writing = batch
        try:
            await self._write(batch)
        finally:
            self._writing = []

    async def _write(self, batch: list[Completion], last_resort: bool = False) -> None:
        """Write ``batch``: retried whole while the store is away and the
        leases are trusted; split while the store answers but refuses it
        (``last_resort``: these are failures written for refused completions,
        and a refused one is dropped)."""
        delay = RETRY_MIN_DELAY
        answered = 0
        while batch:
            try:
                result = await self._finish(batch)
            except (BackendUnavailableError, TimeoutError) as exc:
                if await self._probe():
                    answered += 1
                    log.debug(
                        "the store answers but refuses %d completions (%d of %d): %s",
                        len(batch),
                        answered,
                        REFUSALS,
                        reason(exc),
                    )
                    if answered >= REFUSALS:
                        await self._split(batch, exc, last_resort)
                        return
                else:
                    answered = 0
                    self.outage.failed("completion", exc)
                    batch = self._still_trusted(batch)
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX_DELAY)
                continue
            except Exception as exc:  # the store answered: it refuses this write
                await self._split(batch, exc, last_resort)
                return
            self.outage.ok("completion")
            self.flushes += 1
            for completion in batch:
                self._report(completion, completion.token in result.applied)
            return

    async def _finish(self, batch: list[Completion]) -> FinishResult:
        params = FinishParams(worker_id=self._worker_id, completions=batch)
        async with asyncio.timeout(self._timeout):
            return await self._backend.finish(params)

    async def _probe(self) -> bool:
        """Whether the store answers a write now: the heartbeat's statement,
        for no lease (it marks the worker seen), bounded like a flush."""
        params = HeartbeatParams(worker_id=self._worker_id, tokens=[], lease=PROBE_LEASE)
        try:
            async with asyncio.timeout(self._timeout):
                await self._backend.heartbeat(params)
        except Exception:
            return False
        return True

    async def _split(self, batch: list[Completion], exc: BaseException, last_resort: bool) -> None:
        """The store refuses ``batch``: write each half on its own; a single
        refused completion is written again as its attempt's failure."""
        if len(batch) > 1:
            half = len(batch) // 2
            await self._write(batch[:half], last_resort)
            await self._write(batch[half:], last_resort)
            return
        [completion] = batch
        token = completion.token
        self.refused += 1
        why = first_line(reason(exc))
        task = None if last_resort else self._claimed.pop(token, None)
        if task is not None:
            log.warning(
                "the store refuses to record this attempt's completion (%s); the attempt is "
                "recorded as failed, without its result or effects",
                why,
                extra={"task_id": token.task_id, "attempt": token.attempt},
            )
            await self._write([outcomes.refused(task, why)], last_resort=True)
            return
        log.error(
            "the store refuses to record this attempt's completion (%s); it is dropped and "
            "the task will be reclaimed when its lease expires",
            why,
            extra={"task_id": token.task_id, "attempt": token.attempt},
        )
        self._report(completion, False)

    def _still_trusted(self, batch: list[Completion]) -> list[Completion]:
        kept = []
        for completion in batch:
            if self._still_held(completion.token):
                kept.append(completion)
            else:
                self._report(completion, False)
        return kept

    def _report(self, completion: Completion, applied: bool) -> None:
        """One completion's write is over (or that of the failure written in its place)."""
        self._unwritten -= 1
        if completion.token in self._stale:  # a newer claim holds its token: not ours
            self._stale.discard(completion.token)
            return
        self._claimed.pop(completion.token, None)
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
