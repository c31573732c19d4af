"""The in-memory backend (``memory://NAME``): for tests of user code.

NOT durable: everything lives in this process and is gone when it exits.
Backends opened with the same URL in one process share one store (a worker
opens several), guarded by one lock, so every operation is atomic. It keeps
the same contract as the SQL backends for leases, fencing, the attempt log,
the crash budget and cancel, with the clock of this process (or an injected
``now``). It offers no transactional enqueue and no attempt transaction;
an enqueue wakes the idle workers of its store at once (they are all in
this process).

Inline mode (``memory://NAME?inline=true``) is for tests of code that
enqueues: the App runs every due task of the enqueued queues, in this
process, before ``enqueue`` returns (see :mod:`conveyor.testing`).
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import threading
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from conveyor import payload as codec
from conveyor.backends import wake
from conveyor.backends.protocol import (
    AttemptTransaction,
    Capability,
    ClaimedTask,
    ClaimParams,
    Completion,
    Effects,
    EnqueueParams,
    FinishParams,
    FinishResult,
    HeartbeatParams,
    HeartbeatResult,
    NewTask,
    SendParams,
    TaskFilter,
    Transition,
    Wakeup,
    WorkerInfo,
    WorkFilter,
)
from conveyor.backends.stored import LEASE_EXPIRED, check_recipient, lease_lost_message
from conveyor.errors import (
    ConfigurationError,
    InvalidTransitionError,
    TaskNotFoundError,
)
from conveyor.model import (
    Attempt,
    LeaseToken,
    Message,
    MessageKind,
    Outcome,
    RetryPolicy,
    Task,
    TaskState,
)


@dataclass
class _Row:
    """A task as stored: the mutable twin of :class:`~conveyor.model.Task`."""

    id: int
    name: str
    queue: str
    payload: str
    priority: int
    run_at: datetime
    max_attempts: int
    retry: RetryPolicy
    timeout: float | None
    lease: float | None
    created_at: datetime
    state: TaskState = TaskState.PENDING
    attempt: int = 0
    spent: int = 0
    worker_id: str | None = None
    lease_expires_at: datetime | None = None
    cancel_requested: bool = False
    result: str | None = None
    finished_at: datetime | None = None
    step: str | None = None
    parent_id: int | None = None
    inbox: bool = False
    idempotency_key: str | None = None
    attempts: list[Attempt] = field(default_factory=list)

    def snapshot(self, with_attempts: bool) -> Task:
        return Task(
            id=self.id,
            name=self.name,
            queue=self.queue,
            payload=codec.decode_for_display(self.payload),
            state=self.state,
            priority=self.priority,
            run_at=self.run_at,
            attempt=self.attempt,
            max_attempts=self.max_attempts,
            retry=self.retry,
            timeout=self.timeout,
            lease=self.lease,
            result=codec.decode_for_display(self.result) if self.result is not None else None,
            created_at=self.created_at,
            finished_at=self.finished_at,
            worker_id=self.worker_id,
            lease_expires_at=self.lease_expires_at,
            cancel_requested=self.cancel_requested,
            attempts=tuple(self.attempts) if with_attempts else (),
            step=self.step,
            parent_id=self.parent_id,
            inbox=self.inbox,
            idempotency_key=self.idempotency_key,
        )

    def close_attempt(self, now: datetime, outcome: Outcome, **fields: Any) -> None:
        last = self.attempts[-1]
        self.attempts[-1] = dataclasses.replace(last, outcome=outcome, finished_at=now, **fields)

    def live(self, attempt: int, worker_id: str, now: datetime) -> bool:
        """The fence: this lease token, this owner, a lease not yet expired."""
        return (
            self.attempt == attempt
            and self.worker_id == worker_id
            and self.lease_expires_at is not None
            and self.lease_expires_at > now
        )


@dataclass
class _Store:
    """Tasks by id, plus the two indexes a claim reads: per queue, a heap of
    pending tasks in claim order, and the set of tasks in progress. A heap
    entry is checked against its row when popped (a stale one is dropped),
    so a state change never has to find and remove it."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    tasks: dict[int, _Row] = field(default_factory=dict)
    workers: dict[str, WorkerInfo] = field(default_factory=dict)
    pending: dict[str, list[tuple[int, datetime, int]]] = field(default_factory=dict)
    in_progress: set[int] = field(default_factory=set)
    message_ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    inboxes: dict[int, list[Message]] = field(default_factory=dict)
    children: dict[int, set[int]] = field(default_factory=dict)
    woken: set[str] = field(default_factory=set)
    """Queues where tasks became due under the lock; notified after it."""
    keys: dict[tuple[str, str], int] = field(default_factory=dict)
    """Task ids by (name, idempotency key)."""
    message_keys: dict[tuple[int, str], int] = field(default_factory=dict)
    """Message ids by (recipient, idempotency key)."""
    cancelling: set[int] = field(default_factory=set)
    """Running tasks whose cancel was requested under the lock; their
    workers are told after it."""

    def make_pending(self, row: _Row) -> None:
        """Mark ``row`` pending (at its run_at) and index it for claims."""
        row.state = TaskState.PENDING
        self.in_progress.discard(row.id)
        heapq.heappush(self.pending.setdefault(row.queue, []), _entry(row))

    def insert(self, new: NewTask, now: datetime) -> _Row:
        """Store ``new`` (pending); a task whose name and idempotency key are
        stored already is not inserted again: the stored one comes back."""
        key = new.idempotency_key
        if key is not None and (new.name, key) in self.keys:
            return self.tasks[self.keys[(new.name, key)]]
        row = _Row(
            id=next(self.ids),
            name=new.name,
            queue=new.queue,
            payload=new.payload,
            priority=new.priority,
            run_at=new.run_at or now + _seconds(new.delay),
            max_attempts=new.max_attempts,
            retry=new.retry,
            timeout=new.timeout,
            lease=new.lease,
            created_at=now,
            step=new.step,
            parent_id=new.parent_id,
            inbox=new.inbox,
            idempotency_key=key,
        )
        self.tasks[row.id] = row
        if key is not None:
            self.keys[(new.name, key)] = row.id
        self.make_pending(row)
        if new.parent_id is not None:
            self.children.setdefault(new.parent_id, set()).add(row.id)
        if new.message is not None:  # its first input: it does not move a delayed start
            self.append(row, new.parent_id, MessageKind.MESSAGE, new.message, now)
        return row

    def append(
        self, row: _Row, sender: int | None, kind: MessageKind, body: str, now: datetime
    ) -> int:
        message = Message(next(self.message_ids), row.id, sender, kind, codec.decode(body), now)
        self.inboxes.setdefault(row.id, []).append(message)
        return message.id

    def deliver(
        self, row: _Row, sender: int | None, kind: MessageKind, body: str, now: datetime
    ) -> int:
        """Put a message in ``row``'s inbox and wake it (the caller checked it takes one)."""
        message_id = self.append(row, sender, kind, body, now)
        self.wake(row, now)
        return message_id

    def wake(self, row: _Row, now: datetime) -> None:
        """A message arrived: a waiting task is pending again, a sleeping one due now."""
        if row.state is TaskState.WAITING or (row.state is TaskState.PENDING and row.run_at > now):
            row.run_at = min(row.run_at, now)
            self.make_pending(row)
            self.woken.add(row.queue)

    def ended(self, row: _Row, now: datetime) -> None:
        """``row`` reached a terminal state: tell its parent; a cancelled
        coroutine's live children are cancelled too."""
        parent = self.tasks.get(row.parent_id) if row.parent_id is not None else None
        if parent is not None and not parent.state.is_terminal:
            body = codec.encode(
                {
                    "child": row.id,
                    "name": row.name,
                    "state": row.state.value,
                    "result": codec.decode(row.result) if row.result is not None else None,
                }
            )
            self.deliver(parent, row.id, MessageKind.END, body, now)
        if row.state is TaskState.CANCELLED:
            for child_id in sorted(self.children.get(row.id, ())):
                self.cancel(self.tasks[child_id], now)

    def cancel(self, row: _Row, now: datetime) -> None:
        if row.state in (TaskState.PENDING, TaskState.WAITING):
            row.state, row.finished_at = TaskState.CANCELLED, now
            self.ended(row, now)
        elif row.state is TaskState.IN_PROGRESS:
            row.cancel_requested = True
            self.cancelling.add(row.id)

    def due(self, queue: str, names: set[str], now: datetime, limit: int) -> list[_Row]:
        """The head of ``queue``'s due pending tasks of ``names``, in claim order.

        Every valid entry popped goes back: the caller decides which rows it
        hands out, and those entries are dropped as stale later."""
        heap = self.pending.get(queue)
        if not heap:
            return []
        found: list[_Row] = []
        kept: list[tuple[int, datetime, int]] = []
        while heap and len(found) < limit:
            entry = heapq.heappop(heap)
            row = self.tasks.get(entry[2])
            stale = row is None or row.state is not TaskState.PENDING or _entry(row) != entry
            if stale or (kept and kept[-1] == entry):  # moved on, or a duplicate
                continue
            kept.append(entry)
            if row is not None and row.run_at <= now and row.name in names:
                found.append(row)
        for entry in kept:
            heapq.heappush(heap, entry)
        return found


def _entry(row: _Row) -> tuple[int, datetime, int]:
    return (-row.priority, row.run_at, row.id)


_STORES: dict[str, _Store] = {}
_STORES_LOCK = threading.Lock()


def _move(row: _Row, move: Transition) -> None:
    """A step transition: the next step, its state and options (its run time
    is set only if the task is pending again, not if it was cancelled)."""
    row.step, row.payload, row.spent = move.step, move.state, 0
    row.max_attempts, row.retry = move.max_attempts, move.retry
    row.timeout, row.lease = move.timeout, move.lease


def _clock(now: datetime | None) -> datetime:
    return now if now is not None else datetime.now(UTC)


def _seconds(value: float) -> timedelta:
    return timedelta(seconds=value)


class MemoryBackend:
    """Tasks in this process's memory; see the module docstring for the limits."""

    capabilities = frozenset({Capability.NOTIFICATIONS})

    def __init__(self, name: str = "default", *, inline: bool = False, **_options: Any) -> None:
        self.name = name
        if inline:
            self.capabilities = self.capabilities | {Capability.INLINE}
        self._wake_key = f"memory:{name}"
        with _STORES_LOCK:
            self._store = _STORES.setdefault(name, _Store())

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def migrate(self) -> list[int]:
        return []

    async def destroy(self) -> None:
        with _STORES_LOCK:
            _STORES.pop(self.name, None)
            self._store = _STORES.setdefault(self.name, _Store())

    # -- enqueue -----------------------------------------------------------

    async def enqueue(self, params: EnqueueParams, connection: Any = None) -> list[int]:
        if connection is not None:
            raise ConfigurationError("the memory backend cannot enqueue inside a transaction")
        now = _clock(params.now)
        with self._store.lock:
            ids = [self._store.insert(new, now).id for new in params.tasks]
        wake.notify(self._wake_key, (t.queue for t in params.tasks))
        return ids

    async def enqueue_chunks(self, chunks: Iterable[Sequence[NewTask]]) -> list[int]:
        return await self.enqueue(EnqueueParams.gathered(chunks))

    def enqueue_sync(self, params: EnqueueParams, connection: Any) -> list[int]:
        raise ConfigurationError("the memory backend cannot enqueue inside a transaction")

    # -- claim, heartbeat, finish ----------------------------------------

    async def claim(self, params: ClaimParams) -> list[ClaimedTask]:
        if params.limit <= 0:
            return []
        now = _clock(params.now)
        names, queues = set(params.names), set(params.queues)
        store = self._store
        with store.lock:
            candidates = [
                row
                for task_id in list(store.in_progress)
                if (row := store.tasks[task_id]).name in names
                and row.queue in queues
                and row.lease_expires_at is not None
                and row.lease_expires_at <= now
                and self._reclaim(row, now)
            ]
            for queue in queues:
                candidates += store.due(queue, names, now, params.limit)
            candidates.sort(key=lambda r: (-r.priority, r.run_at, r.id))
            return [self._hand_out(row, params, now) for row in candidates[: params.limit]]

    def _reclaim(self, row: _Row, now: datetime) -> bool:
        """An expired lease: close its attempt; True if the task may run again."""
        if row.cancel_requested or row.spent >= row.max_attempts:
            message = lease_lost_message(row.cancel_requested, row.spent, row.max_attempts)
            row.close_attempt(
                now, Outcome.LEASE_LOST, error_type="LeaseExpired", error_message=message
            )
            row.state = TaskState.CANCELLED if row.cancel_requested else TaskState.FAILED
            self._store.in_progress.discard(row.id)
            row.worker_id = row.lease_expires_at = None
            row.finished_at = now
            self._store.ended(row, now)
            return False
        return True

    def _hand_out(self, row: _Row, params: ClaimParams, now: datetime) -> ClaimedTask:
        if row.state is TaskState.IN_PROGRESS:  # a reclaim
            row.close_attempt(
                now, Outcome.LEASE_LOST, error_type="LeaseExpired", error_message=LEASE_EXPIRED
            )
        row.state = TaskState.IN_PROGRESS
        self._store.in_progress.add(row.id)
        row.attempt += 1
        row.spent += 1
        row.worker_id = params.worker_id
        row.lease_expires_at = now + _seconds(row.lease or params.lease)
        row.attempts.append(
            Attempt(
                task_id=row.id,
                number=row.attempt,
                worker_id=params.worker_id,
                outcome=Outcome.IN_PROGRESS,
                started_at=now,
                step=row.step,
            )
        )
        return ClaimedTask(
            token=LeaseToken(row.id, row.attempt, params.worker_id),
            name=row.name,
            queue=row.queue,
            payload=row.payload,
            spent=row.spent,
            max_attempts=row.max_attempts,
            retry=row.retry,
            timeout=row.timeout,
            lease=row.lease,
            lease_expires_at=row.lease_expires_at,
            step=row.step,
            parent_id=row.parent_id,
        )

    async def heartbeat(self, params: HeartbeatParams) -> HeartbeatResult:
        now = _clock(params.now)
        renewed, cancel = set(), set()
        with self._store.lock:
            worker = self._store.workers.get(params.worker_id)
            if worker is not None:
                self._store.workers[worker.id] = dataclasses.replace(worker, last_seen_at=now)
            for token in params.tokens:
                row = self._store.tasks.get(token.task_id)
                if row is not None and row.live(token.attempt, params.worker_id, now):
                    row.lease_expires_at = now + _seconds(row.lease or params.lease)
                    renewed.add(token)
                    if row.cancel_requested:
                        cancel.add(token)
        return HeartbeatResult(
            frozenset(renewed), frozenset(params.tokens) - renewed, frozenset(cancel)
        )

    async def cancel_requested(
        self, worker_id: str, tokens: Sequence[LeaseToken]
    ) -> frozenset[LeaseToken]:
        with self._store.lock:
            return frozenset(
                t
                for t in tokens
                if (row := self._store.tasks.get(t.task_id)) is not None
                and row.attempt == t.attempt
                and row.worker_id == worker_id
                and row.cancel_requested
            )

    async def finish(self, params: FinishParams) -> FinishResult:
        now = _clock(params.now)
        applied = set()
        store = self._store
        with store.lock:
            holding = [
                (row, c)
                for c in params.completions
                if (row := store.tasks.get(c.token.task_id)) is not None
                and row.live(c.token.attempt, params.worker_id, now)
            ]
            # As on the SQL backends: every poll's effects first (a child's
            # last messages precede its end), then the endings, then a resting
            # poll with messages left in its inbox is due again.
            for row, c in holding:
                if c.effects is not None:
                    self._apply(row, c.effects, now)
            for row, c in holding:
                self._finish_one(row, c, now)
                applied.add(c.token)
            for row, c in holding:
                if c.effects is not None and store.inboxes.get(row.id):
                    store.wake(row, now)
        self._notify_woken()
        tokens = frozenset(c.token for c in params.completions)
        return FinishResult(frozenset(applied), tokens - applied)

    def _finish_one(self, row: _Row, c: Completion, now: datetime) -> None:
        store = self._store
        state = c.next_state
        if row.cancel_requested and state in (TaskState.PENDING, TaskState.WAITING):
            state = TaskState.CANCELLED
        row.state = state
        store.in_progress.discard(row.id)
        if state is TaskState.SUCCEEDED:
            row.result = c.result
        if c.outcome is Outcome.INTERRUPTED:
            row.spent -= 1
        if c.transition is not None:
            _move(row, c.transition)
        if state is TaskState.PENDING:
            move = c.transition
            row.run_at = (
                (move.run_at or now + _seconds(move.delay))
                if move is not None
                else now + _seconds(c.retry_delay or 0.0)
            )
            store.make_pending(row)
            if row.run_at <= now:  # a workflow's next step, a release: due at once
                store.woken.add(row.queue)
        row.worker_id = row.lease_expires_at = None
        row.finished_at = now if state.is_terminal else None
        error = c.error
        row.close_attempt(
            now,
            c.outcome,
            error_type=error.type if error else None,
            error_message=error.message if error else None,
            traceback=error.traceback if error else None,
        )
        if state.is_terminal:
            store.ended(row, now)

    def _apply(self, row: _Row, effects: Effects, now: datetime) -> None:
        """A poll's consumed messages, sends and spawns."""
        store = self._store
        consumed = set(effects.consumed)
        store.inboxes[row.id] = [m for m in store.inboxes.get(row.id, ()) if m.id not in consumed]
        for new in effects.spawns:
            store.insert(dataclasses.replace(new, parent_id=row.id), now)
            store.woken.add(new.queue)
        for send in effects.sends:
            target = store.tasks.get(send.task_id)
            if target is not None and target.inbox and not target.state.is_terminal:
                store.deliver(target, row.id, MessageKind.MESSAGE, send.body, now)

    def _notify_woken(self) -> None:
        with self._store.lock:
            woken, self._store.woken = self._store.woken, set()
            cancelling, self._store.cancelling = self._store.cancelling, set()
        if woken:
            wake.notify(self._wake_key, woken)
        if cancelling:
            wake.notify_cancel(self._wake_key, sorted(cancelling))

    async def begin_attempt_transaction(self, worker_id: str) -> AttemptTransaction:
        raise ConfigurationError("the memory backend has no attempt transactions")

    def begin_attempt_transaction_sync(self, worker_id: str) -> AttemptTransaction:
        raise ConfigurationError("the memory backend has no attempt transactions")

    # -- control -------------------------------------------------------------

    def _row(self, task_id: int) -> _Row:
        row = self._store.tasks.get(task_id)
        if row is None:
            raise TaskNotFoundError(f"no task with id {task_id}")
        return row

    async def cancel(self, task_id: int, now: datetime | None = None) -> TaskState:
        with self._store.lock:
            row = self._row(task_id)
            if row.state.is_terminal:
                raise InvalidTransitionError(f"cannot cancel task {task_id}: it is {row.state}")
            self._store.cancel(row, _clock(now))
            state = row.state
        self._notify_woken()
        return state

    # -- messages --------------------------------------------------------------

    async def send(self, params: SendParams, connection: Any = None) -> list[int]:
        if connection is not None:
            raise ConfigurationError("the memory backend cannot send inside a transaction")
        now = _clock(params.now)
        store = self._store
        with store.lock:
            sent = {
                index: store.message_keys[(d.task_id, d.idempotency_key)]
                for index, d in enumerate(params.deliveries)
                if d.idempotency_key is not None
                and (d.task_id, d.idempotency_key) in store.message_keys
            }
            targets = {
                index: self._recipient(d.task_id)
                for index, d in enumerate(params.deliveries)
                if index not in sent
            }
            ids = []
            for index, d in enumerate(params.deliveries):
                if index in sent:
                    ids.append(sent[index])
                    continue
                message_id = store.deliver(
                    targets[index], d.sender_id, MessageKind.MESSAGE, d.body, now
                )
                if d.idempotency_key is not None:
                    store.message_keys[(d.task_id, d.idempotency_key)] = message_id
                ids.append(message_id)
        self._notify_woken()
        return ids

    def _recipient(self, task_id: int) -> _Row:
        row = self._store.tasks.get(task_id)
        check_recipient(task_id, row.state if row else None, row is not None and row.inbox)
        assert row is not None
        return row

    def send_sync(self, params: SendParams, connection: Any) -> list[int]:
        raise ConfigurationError("the memory backend cannot send inside a transaction")

    async def inbox(self, task_id: int) -> list[Message]:
        with self._store.lock:
            return list(self._store.inboxes.get(task_id, ()))

    async def retry(self, task_id: int, now: datetime | None = None) -> TaskState:
        with self._store.lock:
            row = self._row(task_id)
            if row.state not in (TaskState.FAILED, TaskState.CANCELLED):
                raise InvalidTransitionError(f"cannot retry task {task_id}: it is {row.state}")
            row.spent, row.run_at = 0, _clock(now)
            self._store.make_pending(row)
            row.cancel_requested, row.result, row.finished_at = False, None, None
            return row.state

    # -- reads ---------------------------------------------------------------

    async def get_task(self, task_id: int, with_attempts: bool = True) -> Task | None:
        with self._store.lock:
            row = self._store.tasks.get(task_id)
            return row.snapshot(with_attempts) if row is not None else None

    async def list_tasks(self, task_filter: TaskFilter) -> list[Task]:
        with self._store.lock:
            rows = [
                r
                for r in reversed(self._store.tasks.values())
                if (task_filter.state is None or r.state is task_filter.state)
                and (task_filter.name is None or r.name == task_filter.name)
                and (task_filter.queue is None or r.queue == task_filter.queue)
            ]
            return [r.snapshot(False) for r in rows[: task_filter.limit]]

    async def count_unfinished(self, work: WorkFilter) -> int:
        now = _clock(work.now)
        names, queues = set(work.names), set(work.queues)
        with self._store.lock:
            return sum(
                1
                for r in self._store.tasks.values()
                if r.name in names
                and r.queue in queues
                and (
                    r.state is TaskState.IN_PROGRESS
                    or (r.state is TaskState.PENDING and r.run_at <= now)
                )
            )

    async def next_due_at(self, queues: Sequence[str]) -> datetime | None:
        wanted = set(queues)
        with self._store.lock:
            return min(
                (
                    r.run_at
                    for r in self._store.tasks.values()
                    if r.state is TaskState.PENDING and r.queue in wanted
                ),
                default=None,
            )

    # -- workers -------------------------------------------------------------

    async def register_worker(self, info: WorkerInfo) -> None:
        now = _clock(None)
        with self._store.lock:
            self._store.workers[info.id] = dataclasses.replace(
                info, started_at=now, last_seen_at=now, stopped_at=None
            )

    async def stop_worker(self, worker_id: str) -> None:
        now = _clock(None)
        with self._store.lock:
            found = self._store.workers.get(worker_id)
            if found is not None:
                self._store.workers[worker_id] = dataclasses.replace(
                    found, stopped_at=now, last_seen_at=now
                )

    async def list_workers(self) -> list[WorkerInfo]:
        with self._store.lock:
            return sorted(
                self._store.workers.values(),
                key=lambda w: w.started_at or _clock(None),
                reverse=True,
            )

    async def wakeups(self, queues: Sequence[str]) -> AsyncIterator[Wakeup]:
        async for wakeup in wake.listen(self._wake_key, queues):
            yield wakeup
