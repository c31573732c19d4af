"""The worker: claims tasks, runs them, keeps their leases, records completions.

This module wires the pieces, runs them and handles signals. Pieces (each
a small start/stop component): the producer (:mod:`.producer`: the claim
loop, the wake-up listener, the start of each attempt), the heartbeat
thread (:mod:`.heartbeat`, which also tells the events of renewed and lost
leases), batched completions (:mod:`.completer`), the cancel watch, the
pruner and the scheduler. Each attempt runs through the client's
middleware, inside the worker's own attempt log (:mod:`.attemptlog`).

Shutdown (:mod:`.stopping`; SIGTERM/SIGINT or :meth:`request_stop`)
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
import threading
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Protocol

from conveyor.backends.capabilities import (
    AttemptTransaction,
    Renewer,
    SharedHeartbeats,
    capability_of,
)
from conveyor.backends.params import (
    ClaimedTask,
    Completion,
    HeartbeatResult,
)
from conveyor.backends.protocol import Backend, Capability
from conveyor.client import Client
from conveyor.coroutine import Coroutine as CoroutineTask
from conveyor.errors import (
    BackendUnavailableError,
    CancelledByRequest,
    LeaseLostError,
)
from conveyor.events import ProgressStored
from conveyor.model import LeaseToken
from conveyor.records import WorkerInfo
from conveyor.schedules import Schedule
from conveyor.task import TaskDef
from conveyor.worker import outcomes
from conveyor.worker.attempt import RunningAttempt
from conveyor.worker.attemptlog import AttemptLog
from conveyor.worker.cancels import CancelConfig, CancelWatch
from conveyor.worker.claims import RETRY_MAX, RETRY_MIN
from conveyor.worker.completer import Completer
from conveyor.worker.config import WorkerConfig
from conveyor.worker.dump import state_dump
from conveyor.worker.heartbeat import Heartbeat, HeartbeatConfig, emit_heartbeat
from conveyor.worker.outage import Outage
from conveyor.worker.processes import ProcessPool
from conveyor.worker.producer import Producer
from conveyor.worker.progress import ProgressReporter, Reported
from conveyor.worker.pruner import Pruner
from conveyor.worker.scheduler import Scheduler
from conveyor.worker.standby import Standby
from conveyor.worker.stopping import shut_down
from conveyor.worker.texts import reason
from conveyor.worker.turns import Turn

log = logging.getLogger("conveyor.worker")


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
        self.stopping = False
        """Stopping: claims no more, and registers no more."""
        self.immediate = False
        """Stopping without the grace (a second signal, or asked so)."""
        self.stop_event: asyncio.Event | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._registering: asyncio.Task[None] | None = None
        self.backend: Backend | None = None
        self.heartbeat: Heartbeat | None = None
        self.completer: Completer | None = None
        self.progress: ProgressReporter | None = None
        self.cancels: CancelWatch | None = None
        self.pruner: Pruner | None = None
        self.scheduler: Scheduler | None = None
        self.outage = Outage()
        """The store's reachability, logged once per change (every part reports)."""
        self.open_transaction: Callable[[], Awaitable[AttemptTransaction]] | None = None
        self.open_transaction_sync: Callable[[], AttemptTransaction] | None = None
        self.producer = Producer(self)
        """The claim loop, its wake-ups and the attempts it starts."""

    @property
    def _running(self) -> dict[LeaseToken, RunningAttempt]:
        return self.producer.attempts

    @property
    def _runners(self) -> set[asyncio.Task[None]]:
        return self.producer.runners

    @property
    def turn(self) -> Turn | None:
        """This worker's place in the wake-up turns of its kind (PostgreSQL)."""
        return self.producer.turn

    @property
    def standby(self) -> Standby | None:
        """This worker's offer of idle slots to enqueues (PostgreSQL)."""
        return self.producer.standby

    @property
    def claims_made(self) -> int:
        """Claims that returned (with tasks or none)."""
        return self.producer.claims_made

    @property
    def claimed_count(self) -> int:
        """Attempts started, from claims and hand-offs."""
        return self.producer.claimed_count

    @property
    def handed_off_count(self) -> int:
        """Tasks started from hand-offs (no claim), of ``claimed_count``."""
        return self.producer.handed_off_count

    @property
    def attempt_log(self) -> AttemptLog:
        """This worker's middleware around its own attempts (outermost)."""
        return self.producer.attempt_log

    # -- control -------------------------------------------------------------

    def request_stop(self, immediate: bool = False) -> None:
        """Stop claiming and shut down (after the grace, unless ``immediate``).

        Safe to call from any thread (and from a signal handler)."""
        loop = self.loop
        if loop is not None and threading.get_ident() != self._loop_thread:
            with contextlib.suppress(RuntimeError):  # the loop is gone: nothing to stop
                loop.call_soon_threadsafe(self.request_stop, immediate)
            return
        if self.stopping:
            immediate = True
        self.stopping = True
        self.immediate = self.immediate or immediate
        for event in (self.stop_event, self.producer.wake):
            if event is not None:
                event.set()

    def progress_by_task(self) -> dict[tuple[str, str], tuple[int, int]]:
        """Per task name and queue, the summed ``done`` and ``total`` of the
        running attempts whose latest progress report gave a total (for
        metrics: one series per task name, never one per task)."""
        sums: dict[tuple[str, str], tuple[int, int]] = {}
        for running in list(self._running.values()):
            reported = running.ctx.last_progress
            if reported is None or reported[1] is None:
                continue
            key = (running.task.name, running.task.queue)
            done, total = sums.get(key, (0, 0))
            sums[key] = (done + reported[0], total + reported[1])
        return sums

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
        self.stop_event = asyncio.Event()
        self.producer.wake = asyncio.Event()
        loop = asyncio.get_running_loop()
        self.loop, self._loop_thread = loop, threading.get_ident()
        backend = self.backend = self.client.make_backend(
            pool_size=self.config.connections(),
            work_pool_size=self.config.work_connections,
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
            await self.producer.claim_loop(backend)
        finally:
            await shut_down(self, backend, listener)
            self._remove_signals(loop)

    def _renewers(self, backend: Backend) -> Callable[[], Renewer]:
        """What the heartbeat thread renews leases with: the backend's
        session connection where it keeps one for the worker, else a
        backend of the heartbeat's own (one connection more)."""

        def own() -> Renewer:
            return self.client.make_backend(pool_size=1, migrate=None)

        if not isinstance(backend, SharedHeartbeats) or backend.session_heartbeats() is None:
            return own
        shared = backend
        return lambda: shared.session_heartbeats() or own()

    def _start_parts(
        self, backend: Backend, loop: asyncio.AbstractEventLoop
    ) -> asyncio.Task[None] | None:
        """Start the heartbeat, completer, cancel watch, pruner, scheduler,
        turns and hand-offs; return the wake-up listener's task (None: the
        backend has no notifications)."""
        self.heartbeat = Heartbeat(
            HeartbeatConfig(self.id, self.config.lease, self.config.heartbeat_interval),
            self._renewers(backend),
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
            self.open_transaction = functools.partial(
                transactions.begin_attempt_transaction, self.id
            )
            self.open_transaction_sync = functools.partial(
                transactions.begin_attempt_transaction_sync, self.id
            )
        self.completer.start()
        self.progress = ProgressReporter(
            backend,
            self.id,
            self.config.progress_interval,
            self._progress_stored,
            self.config.lease,
        )
        self.progress.start()
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
            self.producer.take_turns(backend)
            self.producer.stand_by(backend)
            return loop.create_task(self.producer.listen(backend), name="conveyor-listener")
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
                if self.stopping:
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
        if self.stopping or self._registering is not None or backend is None:
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
        emit_heartbeat(self.events, self.id, result, self._running)
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
            "stopping" if self.stopping else "serving",
            len(self._running),
            self.claims_made,
            self.claimed_count,
            self.handed_off_count,
            0 if self.turn is None else self.turn.taken,
            state_dump(),
        )

    async def _sleep(self, seconds: float) -> None:
        assert self.stop_event is not None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self.stop_event.wait()

    def _progress_stored(self, task: ClaimedTask, values: Reported) -> None:
        """Called by the progress reporter for each report the store took."""
        if self.events.active:
            token = task.token
            stored = ProgressStored(
                self.id, token.task_id, token.attempt, task.name, task.queue, *values
            )
            self.events.emit(stored)

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
            self.producer.hint()
        if not applied:
            log.warning(
                "completion rejected: the lease was lost",
                extra={"task_id": token.task_id, "attempt": token.attempt},
            )
