"""The producer: a worker's claim loop, its wake-up dispatch, and the start
of each attempt it claims (or is handed off).

It claims while slots are free and work is due (pacing in :mod:`.claims`),
turns the store's wake-ups into claim hints (or hand-offs, cancel hints),
emits ClaimSent/ClaimReturned around each claim while the events have
subscribers, and starts each attempt's runner through the middleware of
the worker (:meth:`Producer.middlewares`). The worker owns the heartbeat,
the completer and the shutdown; the producer reads them from it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any

from conveyor.backends.capabilities import capability_of
from conveyor.backends.params import (
    CancelHint,
    ClaimedTask,
    ClaimParams,
    Completion,
    HandOff,
    HandOffsHeard,
    WorkFilter,
)
from conveyor.backends.protocol import Backend, Capability
from conveyor.context import TaskContext
from conveyor.errors import LeaseLostError
from conveyor.events import ClaimReturned, ClaimSent
from conveyor.middleware import AttemptInfo, Middlewares
from conveyor.model import LeaseToken, Message
from conveyor.worker.attempt import RunningAttempt
from conveyor.worker.attemptlog import AttemptLog
from conveyor.worker.claims import ClaimOutcome, Claims, Pace
from conveyor.worker.outage import answered
from conveyor.worker.standby import Standby
from conveyor.worker.texts import reason
from conveyor.worker.turns import Turn, worker_kind

if TYPE_CHECKING:
    from conveyor.worker.worker import Worker

log = logging.getLogger("conveyor.worker")


def _start_runner(
    coro: Coroutine[Any, Any, None], loop: asyncio.AbstractEventLoop
) -> asyncio.Task[None]:
    """Start an attempt's runner on ``loop``, the running one. On Python 3.12+
    it starts eagerly: its first step runs now, as the current task and in
    its own context, so an attempt whose handler never waits ends without a
    turn of the event loop (several microseconds less per attempt). Before
    3.12 it is scheduled as usual."""
    if sys.version_info >= (3, 12):
        return asyncio.Task(coro, loop=loop, eager_start=True)
    return loop.create_task(coro)


class Producer:
    """The claim loop and the attempts it starts, for ``worker``."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.config = worker.config
        self.id = worker.id
        self.tasks = worker.tasks
        self.names = worker.names
        self.queues = worker.queues
        self.inbox_names = worker.inbox_names
        self.client = worker.client
        self.events = worker.events
        self.outage = worker.outage
        self.processes = worker.processes
        self.attempts: dict[LeaseToken, RunningAttempt] = {}
        """The attempts running now, by lease token."""
        self.runners: set[asyncio.Task[None]] = set()
        """The asyncio tasks that run them (each leaves the set as its last step)."""
        self.wake: asyncio.Event | None = None
        """Set when a claim returns, a slot frees, a wake-up or a stop arrives."""
        self._hinted = False
        self.claimed_count = 0
        self.claims_made = 0
        self.turn: Turn | None = None
        """This worker's place in the wake-up turns of its kind (PostgreSQL)."""
        self.standby: Standby | None = None
        """This worker's offer of idle slots to enqueues (PostgreSQL)."""
        self.attempt_log = AttemptLog(quiet=not self.config.log_attempts)
        """This worker's middleware around its own attempts (outermost)."""
        self._client_chain: Middlewares | None = None
        self._chain = Middlewares()

    def middlewares(self) -> Middlewares:
        """Around this worker's attempts: its attempt log, then the client's
        middleware (composed again only when the client's changed)."""
        current = self.client.middlewares
        if current is not self._client_chain:
            self._client_chain = current
            self._chain = current.with_(self.attempt_log, first=True)
        return self._chain

    @property
    def handed_off_count(self) -> int:
        """Tasks started from hand-offs (no claim), of ``claimed_count``."""
        return 0 if self.standby is None else self.standby.handed_off

    def take_turns(self, backend: Backend) -> None:
        """Join the wake-up turns of this worker's kind, where the store has them."""
        turns = capability_of(backend, Capability.TURNS)
        if turns is None or not self.config.wakeup_turns or not self.names:
            return
        self.turn = Turn(turns.turn_lock(worker_kind(self.queues, self.names)), self.hint)
        self.turn.start()

    def stand_by(self, backend: Backend) -> None:
        """Offer idle slots to enqueues, where the store has hand-offs."""
        store = capability_of(backend, Capability.HANDOFF)
        config = self.config
        if store is None or not config.handoffs or config.burst or not self.names:
            return
        self.standby = Standby(
            store,
            self.id,
            self.queues,
            self.names,
            config.concurrency,
            config.lease,
            config.heartbeat_interval,
            functools.partial(self.start_all, backend=backend, handed_off=True),
            self.wake.set if self.wake is not None else lambda: None,
            self.outage,
        )

    def hint(self) -> None:
        """Work may be due: claim at once rather than at the next poll."""
        self._hinted = True
        if self.wake is not None:
            self.wake.set()

    async def listen(self, backend: Backend) -> None:
        """Turn wake-ups into claim hints. Wake-ups are only hints: if the
        listener fails, the worker goes on polling, and says so."""
        assert self.wake is not None
        standby = self.standby
        try:
            if standby is None:
                wakeups = backend.wakeups(self.queues)
            else:
                wakeups = backend.wakeups(self.queues, handoffs_for=standby.listen_as)
            async for wakeup in wakeups:
                if isinstance(wakeup, CancelHint):
                    if self.attempts and self.worker.cancels is not None:
                        self.worker.cancels.hint(wakeup.task_id)
                    continue
                if isinstance(wakeup, HandOff):
                    if standby is not None:
                        standby.heard(wakeup)
                    continue
                if isinstance(wakeup, HandOffsHeard):
                    if standby is not None:
                        standby.hearing_changed(wakeup)
                    continue
                if self.turn is not None and not self.turn.answers:
                    continue  # another worker of this kind holds the turn: it claims
                self.hint()
        except Exception as exc:
            log.warning(
                "wake-ups stopped (%s); polling every %.1fs", reason(exc), self.config.poll_interval
            )
            if standby is not None:
                standby.deaf()

    async def claim_loop(self, backend: Backend) -> None:
        """Claim while slots are free and work is due (see :mod:`.claims`)."""
        assert self.wake is not None
        wake = self.wake
        claims = Claims(self.config.concurrency, wake.set)
        standby = self.standby
        pace = Pace(self.config.poll_interval)
        try:
            while not self.worker.stopping:
                if self._hinted:
                    self._hinted = False
                    pace.hinted(time.monotonic())
                wake.clear()
                for outcome in claims.collect():
                    self._take(outcome, pace, time.monotonic(), backend)
                now = time.monotonic()
                free = self.config.concurrency - len(self.attempts) - claims.reserved
                if standby is not None:
                    claim_due = bool(self.names) and pace.may_claim(now)
                    standby.tick(now, not pace.due and not claims, free, claim_due)
                    free -= standby.reserved()
                if self.turn is not None:
                    # Slots a claim in flight reserved count as free: a worker
                    # would otherwise give its turn up with each claim it sends.
                    idle_slots = self.config.concurrency - len(self.attempts)
                    self.turn.want(idle_slots > 0 and not claims.flowing)
                if self.names and pace.may_claim(now) and claims.may_send(free):
                    claims.send(functools.partial(self._claim, backend), free)
                    continue
                idle = not pace.due and not claims and not self.attempts
                if self.config.burst and idle and await self._nothing_due(backend):
                    log.info("burst: nothing due or running; stopping")
                    return
                until = None if standby is None else standby.timeout(now)
                await self._wait(_soonest(pace.timeout(now), until))
        finally:
            if self.turn is not None:
                self.turn.want(False)  # a stopping worker claims no more: next in line
            # Claims already sent may have committed: their tasks are ours to
            # run (or, on an immediate stop, to release) like every other.
            for outcome in await claims.settle():
                if not isinstance(outcome.result, BaseException):
                    self.start_all(outcome.result, outcome.sent_at, backend)
            if standby is not None:
                # So are the hand-offs still owed, read from the store.
                await standby.close()

    def _take(self, outcome: ClaimOutcome, pace: Pace, now: float, backend: Backend) -> None:
        """Start a returned claim's tasks, or note its failure."""
        if isinstance(outcome.result, BaseException):
            pace.failed(now)
            if answered(outcome.result):
                self.outage.refused("claim", outcome.result)
            else:
                self.outage.failed("claim", outcome.result)
            return
        self.outage.ok("claim")
        self.claims_made += 1
        self.start_all(outcome.result, outcome.sent_at, backend)
        pace.returned(len(outcome.result), outcome.limit, outcome.sent_at, now)

    async def _claim(self, backend: Backend, limit: int) -> list[ClaimedTask]:
        params = ClaimParams(
            worker_id=self.id,
            names=self.names,
            queues=self.queues,
            limit=limit,
            lease=self.config.lease,
            inbox_names=self.inbox_names,
        )
        if self.events.active:
            return await self._claim_told(backend, params)
        return await self._claim_bounded(backend, params)

    async def _claim_bounded(self, backend: Backend, params: ClaimParams) -> list[ClaimedTask]:
        # Bounded: a connection that swallows packets must not stall claiming.
        # A claim that times out may still commit later; its tasks then wait
        # out their lease and are reclaimed.
        async with asyncio.timeout(self.config.lease):
            return await backend.claim(params)

    async def _claim_told(self, backend: Backend, params: ClaimParams) -> list[ClaimedTask]:
        """A claim, between its ClaimSent and ClaimReturned events."""
        self.events.emit(ClaimSent(self.id, params.limit))
        sent = time.monotonic()
        try:
            found = await self._claim_bounded(backend, params)
        except Exception as exc:
            seconds = time.monotonic() - sent
            self.events.emit(ClaimReturned(self.id, params.limit, 0, seconds, reason(exc)))
            raise
        seconds = time.monotonic() - sent
        self.events.emit(ClaimReturned(self.id, params.limit, len(found), seconds))
        return found

    async def _nothing_due(self, backend: Backend) -> bool:
        if self.worker.completer is not None:
            await self.worker.completer.wait_idle()  # our own completions must be written first
        try:
            left = await backend.count_unfinished(WorkFilter(names=self.names, queues=self.queues))
        except Exception as exc:
            log.warning("cannot count unfinished tasks: %s", reason(exc))
            return False
        return left == 0

    async def _wait(self, timeout: float | None) -> None:
        """Until a claim returns, a slot frees, a wake-up or a stop arrives, or ``timeout``."""
        assert self.wake is not None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self.wake.wait()

    def start_all(
        self, tasks: list[ClaimedTask], sent_at: float, backend: Backend, handed_off: bool = False
    ) -> None:
        """Run the tasks of one claim sent at ``sent_at`` (or of a hand-off
        whose lease began then), their leases held first."""
        assert self.worker.heartbeat is not None
        lease = self.config.lease
        self.worker.heartbeat.hold_many(((t.token, t.lease or lease) for t in tasks), sent_at)
        for task in tasks:
            self._start(task, backend, handed_off)

    def _start(self, task: ClaimedTask, backend: Backend, handed_off: bool = False) -> None:
        if task.token in self.attempts:
            self._supersede(self.attempts[task.token])
        definition = self.tasks[task.name]
        self.claimed_count += 1
        opener = sync_opener = None
        if self.worker.open_transaction is not None:
            if definition.executor == "async":
                opener = self.worker.open_transaction
            elif definition.executor == "thread":
                sync_opener = self.worker.open_transaction_sync
        ctx = TaskContext(
            task.token.task_id,
            task.name,
            task.queue,
            task.token.attempt,
            self.id,
            step=task.step,
            step_attempt=task.spent,
            open_transaction=opener,
            open_transaction_sync=sync_opener,
            parent_id=task.parent_id,
            read_inbox=self._inbox_reader(backend, task),
            nonce=task.token.nonce,
            progress_sink=self.worker.progress.sink(task) if self.worker.progress else None,
        )
        assert self.worker.loop is not None
        running = RunningAttempt(
            task,
            definition,
            ctx,
            self.client.max_payload_bytes,
            self.processes,
            self.worker.loop,
            backend.dependencies if task.receives is not None else None,
        )
        self.attempts[task.token] = running
        info = running.info = AttemptInfo(task, running.kind, self.id, running.started, handed_off)
        try:
            attempt = self.middlewares().attempt(running.run, info)
        except Exception as exc:  # a middleware's: the runner's crash path takes it
            attempt = _raise(exc)
        runner = _start_runner(self._run_attempt(running, attempt), running.loop)
        # The runner leaves the set itself, as its last step (a done callback
        # would cost every attempt one more turn of the event loop); one that
        # already ended, eagerly, is not added.
        if not runner.done():
            self.runners.add(runner)

    def _supersede(self, stale: RunningAttempt) -> None:
        """The store handed out a lease token this worker holds: it no longer
        has the task of that attempt (a store restored from a copy, or a
        server restarted without its data, gives its id out again), so the
        new claim is of another task. The old attempt is stopped and nothing
        of it is written: its completion, queued or to come, would finish the
        new task. One already being written is beyond recall."""
        token = stale.task.token
        log.error(
            "the store handed out again the lease of a running attempt: it lost that "
            "task (restored or wiped); the old attempt is stopped and its result dropped",
            extra={"task_id": token.task_id, "attempt": token.attempt},
        )
        stale.superseded = True
        if stale.info is not None:
            stale.info.superseded = True
        stale.stop(LeaseLostError(f"task {token.task_id} was lost by the store"))
        if self.worker.completer is not None:
            self.worker.completer.discard(token)

    def _inbox_reader(
        self, backend: Backend, task: ClaimedTask
    ) -> Callable[[], Awaitable[list[Message]]]:
        read: Callable[[], Awaitable[list[Message]]] = functools.partial(
            backend.inbox, task.token.task_id
        )
        if task.inbox is not None:
            read = _first_read(task.inbox, read)
        return self.middlewares().inbox_reader(read)

    async def _run_attempt(
        self, running: RunningAttempt, attempt: Awaitable[Completion | None]
    ) -> None:
        """Await ``attempt`` (the middleware around ``running.run()``) and
        hand its completion to the completer."""
        assert self.worker.heartbeat is not None
        assert self.worker.completer is not None
        token = running.task.token
        try:
            try:
                completion = await attempt
            except Exception:  # a bug of ours must not lose the slot or the worker
                log.exception("attempt crashed in the worker", extra={"task_id": token.task_id})
                completion = None
            finally:
                if self.attempts.get(token) is running:
                    del self.attempts[token]
                # In burst mode a completion may be the last one, or make work due
                # that no wake-up announces: it counts as a hint.
                self._hinted = self._hinted or self.config.burst
                if self.wake is not None:
                    self.wake.set()
            progress = self.worker.progress
            if running.superseded:
                if progress is not None:
                    progress.forget(token)
                return  # the lease token is the new claim's now
            if completion is None:
                if progress is not None:
                    progress.forget(token)
                self.worker.heartbeat.release(token)
            else:
                if progress is not None and progress.owes(token):
                    await progress.last(token)  # the last report, before the end
                self.worker.completer.submit(completion, running.task)
        finally:
            self.runners.discard(asyncio.current_task(running.loop))


def _soonest(*timeouts: float | None) -> float | None:
    """The shortest of ``timeouts`` (None: no limit)."""
    given = [t for t in timeouts if t is not None]
    return min(given) if given else None


async def _raise(exc: Exception) -> Completion | None:
    raise exc


def _first_read(
    inbox: list[Message], read: Callable[[], Awaitable[list[Message]]]
) -> Callable[[], Awaitable[list[Message]]]:
    """The inbox the claim read, at the first read; the store's after."""
    given = [inbox]

    async def reader() -> list[Message]:
        if given:
            return given.pop()
        return await read()

    return reader
