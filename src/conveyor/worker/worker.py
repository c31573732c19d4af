"""The worker: claims tasks, runs them, keeps their leases, records completions.

Pieces (each a small start/stop component): the claim loop (here), the
heartbeat thread (:mod:`.heartbeat`), batched completions (:mod:`.completer`)
and the wake-up listener. Shutdown (SIGTERM/SIGINT or :meth:`request_stop`)
stops claiming, keeps heartbeating while running handlers drain for up to
``grace`` seconds, then stops what is left and releases it as
``interrupted`` (pending again at once, no attempt burned). A second signal
skips the grace.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import Any, Protocol

from conveyor.backends.capabilities import AttemptTransaction, capability_of
from conveyor.backends.params import (
    CancelHint,
    ClaimedTask,
    ClaimParams,
    Completion,
    HandOff,
    HandOffsHeard,
    HeartbeatResult,
    WorkFilter,
)
from conveyor.backends.protocol import Backend, Capability
from conveyor.client import Client
from conveyor.context import TaskContext
from conveyor.coroutine import Coroutine as CoroutineTask
from conveyor.errors import (
    BackendUnavailableError,
    CancelledByRequest,
    LeaseLostError,
    WorkerShutdown,
)
from conveyor.events import (
    ClaimReturned,
    ClaimSent,
    LeaseLost,
    LeaseRenewed,
)
from conveyor.middleware import AttemptInfo, Middlewares
from conveyor.model import LeaseToken, Message
from conveyor.records import WorkerInfo
from conveyor.schedules import Schedule
from conveyor.task import TaskDef
from conveyor.worker import outcomes
from conveyor.worker.attempt import RunningAttempt
from conveyor.worker.attemptlog import AttemptLog
from conveyor.worker.cancels import CancelConfig, CancelWatch
from conveyor.worker.claims import RETRY_MAX, RETRY_MIN, ClaimOutcome, Claims, Pace
from conveyor.worker.completer import Completer
from conveyor.worker.config import WorkerConfig
from conveyor.worker.dump import state_dump
from conveyor.worker.heartbeat import Heartbeat, HeartbeatConfig
from conveyor.worker.outage import Outage, answered
from conveyor.worker.processes import ProcessPool
from conveyor.worker.pruner import Pruner
from conveyor.worker.scheduler import Scheduler
from conveyor.worker.standby import Standby
from conveyor.worker.stopping import cancel_and_wait
from conveyor.worker.texts import reason
from conveyor.worker.turns import Turn, worker_kind

log = logging.getLogger("conveyor.worker")

ABANDON_SETTLE = 2.0
"""Seconds a shutdown gives the runners of abandoned handlers to end their
attempt transactions before it goes on."""
LAST_WRITES = 5.0
"""Seconds a shutdown gives, once its handlers have ended or been given up,
to the completions still unwritten, and as much to its exit from the
workers table: what is not written by then is given up (the leases expire
and the tasks are reclaimed)."""


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


class Registry(Protocol):
    """What a worker is built from: the registered tasks and schedules by
    name, and the client of the store they are in (an :class:`~conveyor.App`
    is all three)."""

    @property
    def tasks(self) -> Mapping[str, TaskDef]: ...

    @property
    def client(self) -> Client: ...

    @property
    def schedules(self) -> Mapping[str, Schedule]: ...


class Worker:
    """Runs a registry's tasks (``Worker(app, config)``); ``await run()`` until stopped."""

    def __init__(self, registry: Registry, config: WorkerConfig | None = None) -> None:
        self.tasks: Mapping[str, TaskDef] = dict(registry.tasks)
        self.schedules: Mapping[str, Schedule] = dict(registry.schedules)
        self.client = registry.client
        self.events = registry.client.events
        """The client's events, where this worker emits its own."""
        self.config = config or WorkerConfig()
        self.id = (
            self.config.worker_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        )
        self.names = sorted(self.tasks)
        self.inbox_names = sorted(n for n, t in self.tasks.items() if isinstance(t, CoroutineTask))
        """Coroutine tasks: their inbox may come with their claim."""
        self.queues: Sequence[str] = tuple(
            self.config.queues or sorted({t.defaults.queue for t in self.tasks.values()})
        )
        self.processes = ProcessPool(self.config.kept_processes())
        """The handler processes of ``process=True`` tasks, kept between attempts."""
        self._running: dict[LeaseToken, RunningAttempt] = {}
        self._runners: set[asyncio.Task[None]] = set()
        self._stopping = False
        self._immediate = False
        self._stop_event: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._wake: asyncio.Event | None = None
        self._hinted = False
        self._registering: asyncio.Task[None] | None = None
        self.backend: Backend | None = None
        self.heartbeat: Heartbeat | None = None
        self.completer: Completer | None = None
        self.cancels: CancelWatch | None = None
        self.pruner: Pruner | None = None
        self.scheduler: Scheduler | None = None
        self.claimed_count = 0
        self.turn: Turn | None = None
        """This worker's place in the wake-up turns of its kind (PostgreSQL)."""
        self.standby: Standby | None = None
        """This worker's offer of idle slots to enqueues (PostgreSQL)."""
        self.outage = Outage()
        """The store's reachability, logged once per change (every part reports)."""
        self.claims_made = 0
        self._open_transaction: Callable[[], Awaitable[AttemptTransaction]] | None = None
        self._open_transaction_sync: Callable[[], AttemptTransaction] | None = None
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

    # -- control -------------------------------------------------------------

    def request_stop(self, immediate: bool = False) -> None:
        """Stop claiming and shut down (after the grace, unless ``immediate``).

        Safe to call from any thread (and from a signal handler)."""
        loop = self._loop
        if loop is not None and threading.get_ident() != self._loop_thread:
            with contextlib.suppress(RuntimeError):  # the loop is gone: nothing to stop
                loop.call_soon_threadsafe(self.request_stop, immediate)
            return
        if self._stopping:
            immediate = True
        self._stopping = True
        self._immediate = self._immediate or immediate
        for event in (self._stop_event, self._wake):
            if event is not None:
                event.set()

    @property
    def running(self) -> list[LeaseToken]:
        """The lease tokens of the attempts running now."""
        return list(self._running)

    @property
    def running_count(self) -> int:
        """How many attempts run now (safe to read from any thread)."""
        return len(self._running)

    # -- lifecycle -----------------------------------------------------------

    async def run(self) -> None:
        """Serve until stopped (or, in burst mode, until nothing is due)."""
        log.info(
            "worker %s on %s: queues %s; tasks %s; %d slots",
            self.id,
            self.client.location,
            ",".join(self.queues),
            ", ".join(self.names) or "none",
            self.config.concurrency,
        )
        if not self.names:
            log.warning("the app registers no tasks: nothing to run")
        self._stop_event = asyncio.Event()
        self._wake = asyncio.Event()
        loop = asyncio.get_running_loop()
        self._loop, self._loop_thread = loop, threading.get_ident()
        backend = self.backend = self.client.make_backend(
            pool_size=self.config.connections(),
            sweep_interval=self.config.poll_interval,
            # Migrated in _enter, which waits out a store lost after this
            # connect; a client that must not migrate refuses a store missing
            # or behind here, creating nothing (not even a SQLite file).
            migrate=None if self.client.auto_migrate else False,
        )
        await backend.open()  # a store that cannot be reached at all fails at once
        try:
            await self._enter(backend)
        except BaseException:
            await backend.close()
            raise
        listener: asyncio.Task[None] | None = None
        try:  # whatever started is stopped, and the backend closed, however this ends
            listener = self._start_parts(backend, loop)
            self._install_signals(loop)
            await self._claim_loop(backend)
        finally:
            await self._shutdown(backend, listener)
            self._remove_signals(loop)

    def _start_parts(
        self, backend: Backend, loop: asyncio.AbstractEventLoop
    ) -> asyncio.Task[None] | None:
        """Start the heartbeat, completer, cancel watch, pruner, scheduler,
        turns and hand-offs; return the wake-up listener's task (None: the
        backend has no notifications)."""
        self.heartbeat = Heartbeat(
            HeartbeatConfig(self.id, self.config.lease, self.config.heartbeat_interval),
            lambda: self.client.make_backend(pool_size=1, migrate=None),
            lambda result: self._post(loop, result),
            self.outage,
        )
        self.heartbeat.start()
        # Bounded like a claim: a connection that swallows packets must not
        # hold the completions back for good.
        self.completer = Completer(
            backend,
            self.id,
            lambda t: t in self.heartbeat_held(),
            self._recorded,
            timeout=self.config.lease,
            outage=self.outage,
        )
        transactions = capability_of(backend, Capability.ATTEMPT_TRANSACTION)
        if transactions is not None:
            self._open_transaction = functools.partial(
                transactions.begin_attempt_transaction, self.id
            )
            self._open_transaction_sync = functools.partial(
                transactions.begin_attempt_transaction_sync, self.id
            )
        self.completer.start()
        self.cancels = CancelWatch(
            CancelConfig(self.id),
            backend,
            lambda: list(self._running),
            self._stop_cancelled,
            self.outage,
        )
        self.cancels.start()
        if self.config.retention is not None:
            self.pruner = Pruner(backend, self.config.retention)
            self.pruner.start()
        if self.tasks and self.config.schedules:
            self.scheduler = Scheduler(
                backend, self.schedules, self.tasks, self.client.max_payload_bytes, self.events
            )
            self.scheduler.start()
        if Capability.NOTIFICATIONS in backend.capabilities:
            self._take_turns(backend)
            self._stand_by(backend)
            return loop.create_task(self._listen(backend), name="conveyor-listener")
        return None

    async def _enter(self, backend: Backend) -> None:
        """Apply the pending migrations (unless the client was built with
        ``migrate=False``: its store was checked at open) and enter the
        workers table. The store was
        reached when the backend opened; one that is unavailable for a while
        since (SQLite's write lock held elsewhere, a failover, a connection
        cut) is waited for, with back-off, as it is once the worker runs.
        Each registration is bounded by the lease, like a claim: a
        connection that swallows packets is given up and another tried. A
        migration is not bounded (it may wait for another worker's, or build
        an index on a large table)."""
        info = self._info()
        delay = RETRY_MIN
        while True:
            try:
                if self.client.auto_migrate:
                    await backend.migrate()
                async with asyncio.timeout(self.config.lease):
                    await backend.register_worker(info)
                self.outage.ok("registration")
                return
            except (BackendUnavailableError, TimeoutError) as exc:
                if self._stopping:
                    raise BackendUnavailableError(f"stopped while starting: {reason(exc)}") from exc
                self.outage.failed("registration", exc)
                await self._sleep(delay)
                delay = min(delay * 2, RETRY_MAX)

    def _info(self) -> WorkerInfo:
        """This worker's row of the workers table."""
        return WorkerInfo(
            id=self.id,
            host=socket.gethostname(),
            pid=os.getpid(),
            queues=tuple(self.queues),
            concurrency=self.config.concurrency,
            tasks=tuple(self.names),
            beat_seconds=self.config.longest_beat(),
        )

    def _register_again(self) -> None:
        """The store no longer knows this worker (its heartbeat said so: a
        store restarted without its data, a restored backup, an operator
        who deleted the row): register it again, one registration at a
        time, never once the worker is stopping (its stop is recorded)."""
        backend = self.backend
        if self._stopping or self._registering is not None or backend is None:
            return
        self._registering = asyncio.get_running_loop().create_task(
            self._register(backend), name="conveyor-register"
        )

    async def _register(self, backend: Backend) -> None:
        """One registration, bounded by the lease; a failure waits for the
        next heartbeat that finds the worker missing."""
        try:
            async with asyncio.timeout(self.config.lease):
                await backend.register_worker(self._info())
            log.warning("the store no longer knew worker %s: registered it again", self.id)
            self.outage.ok("registration")
        except (BackendUnavailableError, TimeoutError) as exc:
            self.outage.failed("registration", exc)
        except Exception:
            log.exception("registering worker %s again failed", self.id)
        finally:
            self._registering = None

    def heartbeat_held(self) -> set[LeaseToken]:
        """The leases the heartbeat renews now (empty before it starts)."""
        return set(self.heartbeat.held()) if self.heartbeat else set()

    def _post(self, loop: asyncio.AbstractEventLoop, result: HeartbeatResult) -> None:
        with contextlib.suppress(RuntimeError):  # loop closed: the worker is gone
            loop.call_soon_threadsafe(self._on_heartbeat, result)

    def _on_heartbeat(self, result: HeartbeatResult) -> None:
        if self.events.active:
            self._emit_heartbeat(result)
        for token in result.lost:
            running = self._running.get(token)
            if running is not None:
                log.warning(
                    "lease lost; stopping the handler",
                    extra={"task_id": token.task_id, "attempt": token.attempt},
                )
                running.stop(
                    LeaseLostError(f"lease on task {token.task_id} attempt {token.attempt} lost")
                )
        self._stop_cancelled(result.cancel_requested)
        if not result.registered:
            self._register_again()

    def _emit_heartbeat(self, result: HeartbeatResult) -> None:
        if result.renewed:
            self.events.emit(LeaseRenewed(self.id, len(result.renewed)))
        for token in result.lost:
            running = self._running.get(token)
            name, queue = (running.task.name, running.task.queue) if running else ("", "")
            self.events.emit(LeaseLost(self.id, token.task_id, token.attempt, name, queue))

    def _stop_cancelled(self, tokens: frozenset[LeaseToken]) -> None:
        """Stop the handlers of these leases: their tasks were cancelled."""
        for token in tokens:
            running = self._running.get(token)
            if running is not None:
                running.stop(CancelledByRequest(f"task {token.task_id} was cancelled"))

    def _install_signals(self, loop: asyncio.AbstractEventLoop) -> None:
        if not self.config.handle_signals:
            return
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(sig, self.request_stop)
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError, AttributeError):
            loop.add_signal_handler(signal.SIGUSR1, self._dump_state)

    def _remove_signals(self, loop: asyncio.AbstractEventLoop) -> None:
        if not self.config.handle_signals:
            return
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.remove_signal_handler(sig)

    def _dump_state(self) -> None:
        """SIGUSR1: log this worker's counts and what every asyncio task and
        thread is doing."""
        log.warning(
            "worker %s (%s, %d running; %d claims returned, %d tasks started, %d of them "
            "handed off, %d turns taken): %s",
            self.id,
            "stopping" if self._stopping else "serving",
            len(self._running),
            self.claims_made,
            self.claimed_count,
            self.handed_off_count,
            0 if self.turn is None else self.turn.taken,
            state_dump(),
        )

    def _take_turns(self, backend: Backend) -> None:
        """Join the wake-up turns of this worker's kind, where the store has them."""
        turns = capability_of(backend, Capability.TURNS)
        if turns is None or not self.config.wakeup_turns or not self.names:
            return
        self.turn = Turn(turns.turn_lock(worker_kind(self.queues, self.names)), self._hint)
        self.turn.start()

    @property
    def handed_off_count(self) -> int:
        """Tasks started from hand-offs (no claim), of ``claimed_count``."""
        return 0 if self.standby is None else self.standby.handed_off

    def _stand_by(self, backend: Backend) -> None:
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
            functools.partial(self._start_all, backend=backend, handed_off=True),
            self._wake.set if self._wake is not None else lambda: None,
            self.outage,
        )

    def _hint(self) -> None:
        """Work may be due: claim at once rather than at the next poll."""
        self._hinted = True
        if self._wake is not None:
            self._wake.set()

    async def _listen(self, backend: Backend) -> None:
        """Turn wake-ups into claim hints. Wake-ups are only hints: if the
        listener fails, the worker goes on polling, and says so."""
        assert self._wake is not None
        standby = self.standby
        try:
            if standby is None:
                wakeups = backend.wakeups(self.queues)
            else:
                wakeups = backend.wakeups(self.queues, handoffs_for=standby.listen_as)
            async for wakeup in wakeups:
                if isinstance(wakeup, CancelHint):
                    if self._running and self.cancels is not None:
                        self.cancels.hint(wakeup.task_id)
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
                self._hint()
        except Exception as exc:
            log.warning(
                "wake-ups stopped (%s); polling every %.1fs", reason(exc), self.config.poll_interval
            )
            if standby is not None:
                standby.deaf()

    # -- claiming ------------------------------------------------------------

    async def _claim_loop(self, backend: Backend) -> None:
        """Claim while slots are free and work is due (see :mod:`.claims`)."""
        assert self._wake is not None
        wake = self._wake
        claims = Claims(self.config.concurrency, wake.set)
        standby = self.standby
        pace = Pace(self.config.poll_interval)
        try:
            while not self._stopping:
                if self._hinted:
                    self._hinted = False
                    pace.hinted(time.monotonic())
                wake.clear()
                for outcome in claims.collect():
                    self._take(outcome, pace, time.monotonic(), backend)
                now = time.monotonic()
                free = self.config.concurrency - len(self._running) - claims.reserved
                if standby is not None:
                    claim_due = bool(self.names) and pace.may_claim(now)
                    standby.tick(now, not pace.due and not claims, free, claim_due)
                    free -= standby.reserved()
                if self.turn is not None:
                    # Slots a claim in flight reserved count as free: a worker
                    # would otherwise give its turn up with each claim it sends.
                    idle_slots = self.config.concurrency - len(self._running)
                    self.turn.want(idle_slots > 0 and not claims.flowing)
                if self.names and pace.may_claim(now) and claims.may_send(free):
                    claims.send(functools.partial(self._claim, backend), free)
                    continue
                idle = not pace.due and not claims and not self._running
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
                    self._start_all(outcome.result, outcome.sent_at, backend)
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
        self._start_all(outcome.result, outcome.sent_at, backend)
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
        if self.completer is not None:
            await self.completer.wait_idle()  # our own completions must be written first
        try:
            left = await backend.count_unfinished(WorkFilter(names=self.names, queues=self.queues))
        except Exception as exc:
            log.warning("cannot count unfinished tasks: %s", reason(exc))
            return False
        return left == 0

    async def _wait(self, timeout: float | None) -> None:
        """Until a claim returns, a slot frees, a wake-up or a stop arrives, or ``timeout``."""
        assert self._wake is not None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._wake.wait()

    async def _sleep(self, seconds: float) -> None:
        assert self._stop_event is not None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._stop_event.wait()

    def _start_all(
        self, tasks: list[ClaimedTask], sent_at: float, backend: Backend, handed_off: bool = False
    ) -> None:
        """Run the tasks of one claim sent at ``sent_at`` (or of a hand-off
        whose lease began then), their leases held first."""
        assert self.heartbeat is not None
        lease = self.config.lease
        self.heartbeat.hold_many(((t.token, t.lease or lease) for t in tasks), sent_at)
        for task in tasks:
            self._start(task, backend, handed_off)

    def _start(self, task: ClaimedTask, backend: Backend, handed_off: bool = False) -> None:
        if task.token in self._running:
            self._supersede(self._running[task.token])
        definition = self.tasks[task.name]
        self.claimed_count += 1
        opener = sync_opener = None
        if self._open_transaction is not None:
            if definition.executor == "async":
                opener = self._open_transaction
            elif definition.executor == "thread":
                sync_opener = self._open_transaction_sync
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
        )
        assert self._loop is not None
        running = RunningAttempt(
            task, definition, ctx, self.client.max_payload_bytes, self.processes, self._loop
        )
        self._running[task.token] = running
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
            self._runners.add(runner)

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
        if self.completer is not None:
            self.completer.discard(token)

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
        assert self.heartbeat is not None
        assert self.completer is not None
        token = running.task.token
        try:
            try:
                completion = await attempt
            except Exception:  # a bug of ours must not lose the slot or the worker
                log.exception("attempt crashed in the worker", extra={"task_id": token.task_id})
                completion = None
            finally:
                if self._running.get(token) is running:
                    del self._running[token]
                # In burst mode a completion may be the last one, or make work due
                # that no wake-up announces: it counts as a hint.
                self._hinted = self._hinted or self.config.burst
                if self._wake is not None:
                    self._wake.set()
            if running.superseded:
                return  # the lease token is the new claim's now
            if completion is None:
                self.heartbeat.release(token)
            else:
                self.completer.submit(completion, running.task)
        finally:
            self._runners.discard(asyncio.current_task(running.loop))

    def _recorded(self, completion: Completion, applied: bool) -> None:
        """Called by the completer once a completion is written (or rejected)."""
        token = completion.token
        if self.heartbeat is not None:
            self.heartbeat.release(token)
        if self.standby is not None:
            self.standby.recorded(token.task_id)
        if applied and outcomes.makes_work_due(completion):
            # A workflow's next step (or a release, a poll's effects) is due
            # now: claim it at once rather than at the next poll.
            self._hint()
        if not applied:
            log.warning(
                "completion rejected: the lease was lost",
                extra={"task_id": token.task_id, "attempt": token.attempt},
            )

    # -- shutdown ------------------------------------------------------------

    async def _shutdown(self, backend: Backend, listener: asyncio.Task[None] | None) -> None:
        if self._runners and not self._immediate:
            log.info(
                "draining %d running attempts (grace %.0fs)", len(self._runners), self.config.grace
            )
            await self._drain(self.config.grace)
        await self._stop_running()
        await self.processes.close()
        if self.turn is not None:
            await self.turn.stop()
        if listener is not None:
            await cancel_and_wait(listener)
        if self.pruner is not None:
            await self.pruner.stop()
        if self.scheduler is not None:
            await self.scheduler.stop()
        if self.cancels is not None:
            await self.cancels.stop()
        if self.completer is not None:
            await self.completer.stop(LAST_WRITES)
        if self.heartbeat is not None:
            self.heartbeat.stop()
        if self._registering is not None:
            await cancel_and_wait(self._registering)
        with contextlib.suppress(Exception):  # TimeoutError included
            # A stranded connection, a store away: given up.
            async with asyncio.timeout(min(self.config.lease, LAST_WRITES)):
                await backend.stop_worker(self.id)
        await backend.close()
        log.info(
            "worker %s stopped: %d claims returned, %d tasks started, %d of them handed off",
            self.id,
            self.claims_made,
            self.claimed_count,
            self.handed_off_count,
        )

    async def _stop_running(self) -> None:
        """Order every running handler to stop and wait up to ``stop_timeout``
        for them, their leases still renewed: a handler that stops in time
        is released (``interrupted``). Handlers that ignore the order are
        given up: their tasks are never released while they may still run;
        each lease is left to expire (the task is then reclaimed), and an
        abandoned thread's attempt transaction is ended so that nothing it
        writes afterwards commits."""
        if self._running:
            log.info("stopping %d attempts still running", len(self._running))
            for running in list(self._running.values()):
                running.stop(WorkerShutdown("the worker is shutting down"))
        if not self._runners:
            return
        _, stuck = await asyncio.wait(set(self._runners), timeout=self.config.stop_timeout)
        if not stuck:
            return
        log.error(
            "%d handlers ignored the order to stop for %.0fs; their tasks stay in progress "
            "until their leases expire, then are reclaimed",
            len(stuck),
            self.config.stop_timeout,
        )
        for running in list(self._running.values()):
            running.abandon()
        # An abandoned thread's runner ends at once, writing nothing; an
        # async handler that swallows cancellation stays stuck.
        await asyncio.wait(stuck, timeout=ABANDON_SETTLE)

    async def _drain(self, grace: float) -> None:
        assert self._stop_event is not None
        deadline = asyncio.get_running_loop().time() + grace
        while self._runners and not self._immediate:
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                return
            self._stop_event.clear()
            stop_wait = asyncio.ensure_future(self._stop_event.wait())
            await asyncio.wait(
                {*self._runners, stop_wait}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
            )
            stop_wait.cancel()


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
