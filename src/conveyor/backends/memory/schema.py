"""The memory store's tables: what the SQL backends keep in theirs, held in
this process, and the moves that keep them consistent.

:class:`Tables` holds the tasks by id with the indexes a claim reads
(:class:`ClaimIndex`), the inboxes, the unique and concurrency keys, the
pauses, the schedules and their releases, and the workers. Every change of
a task's state goes through :meth:`Tables._move`, which checks it against
:data:`conveyor.model.STATE_CHANGES`: a move the table does not list raises
:class:`~conveyor.model.IllegalStateChangeError`, a bug in conveyor
(``docs/state_machine.md`` explains the table). The moves every section
shares (a message delivered, a task woken, a task's end told to its parent,
a cancel) are here too. Nothing here takes the lock: the sections' public
operations do, each for its whole run, as a SQL backend runs one
transaction.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from conveyor import payload as codec
from conveyor.backends.memory.rows import Row
from conveyor.errors import TaskNotFoundError
from conveyor.model import (
    Cause,
    Message,
    MessageKind,
    Pause,
    PauseKind,
    TaskState,
    check_state_change,
)
from conveyor.records import StoredSchedule, WorkerInfo

# -- the claim indexes ---------------------------------------------------------

Entry = tuple[int, datetime, int]
"""A pending task's place in its queue: priority desc, run_at, id."""


def claim_order(row: Row) -> Entry:
    return (-row.priority, row.run_at, row.id)


@dataclass
class ClaimIndex:
    """Per queue, a heap of pending tasks in claim order, and the set of
    tasks in progress. A heap entry is checked against its row when popped
    (a stale one is dropped), so a state change never has to find and
    remove it: :meth:`update` only adds."""

    pending: dict[str, list[Entry]] = field(default_factory=dict)
    in_progress: set[int] = field(default_factory=set)
    keyed_pending: dict[str, set[int]] = field(default_factory=dict)
    """Pending tasks with a concurrency key (not in ``pending``), by key."""
    keyed_running: dict[str, set[int]] = field(default_factory=dict)
    """Tasks in progress with a concurrency key, by key."""

    def update(self, row: Row) -> None:
        """Index ``row`` in the state it just took (a pending one at its run_at)."""
        if row.state is TaskState.IN_PROGRESS:
            self.in_progress.add(row.id)
        else:
            self.in_progress.discard(row.id)
        key = row.concurrency_key
        if key is not None:
            self._file(self.keyed_pending, key, row.id, row.state is TaskState.PENDING)
            self._file(self.keyed_running, key, row.id, row.state is TaskState.IN_PROGRESS)
        elif row.state is TaskState.PENDING:
            heapq.heappush(self.pending.setdefault(row.queue, []), claim_order(row))

    def forget(self, row: Row) -> None:
        """``row`` is deleted."""
        self.in_progress.discard(row.id)
        if row.concurrency_key is not None:
            self._file(self.keyed_pending, row.concurrency_key, row.id, False)
            self._file(self.keyed_running, row.concurrency_key, row.id, False)

    @staticmethod
    def _file(by_key: dict[str, set[int]], key: str, task_id: int, present: bool) -> None:
        if present:
            by_key.setdefault(key, set()).add(task_id)
        elif key in by_key:
            by_key[key].discard(task_id)
            if not by_key[key]:
                del by_key[key]

    def due(
        self, tasks: Mapping[int, Row], queue: str, names: set[str], now: datetime, limit: int
    ) -> list[Row]:
        """The head of ``queue``'s due pending tasks of ``names`` without a
        concurrency key (keyed ones are claimed by key: :mod:`.flow`), in claim order.

        Every valid entry popped goes back: the caller decides which rows it
        hands out, and those entries are dropped as stale later."""
        heap = self.pending.get(queue)
        if not heap:
            return []
        found: list[Row] = []
        kept: list[Entry] = []
        while heap and len(found) < limit:
            entry = heapq.heappop(heap)
            row = tasks.get(entry[2])
            stale = row is None or row.state is not TaskState.PENDING or claim_order(row) != entry
            if stale or (kept and kept[-1] == entry):  # moved on, or a duplicate
                continue
            kept.append(entry)
            if row is not None and row.run_at <= now and row.name in names:
                found.append(row)
        for entry in kept:
            heapq.heappush(heap, entry)
        return found


# -- inboxes ---------------------------------------------------------------------


@dataclass
class Inboxes:
    """Each task's unread messages, oldest first, and the message each
    (recipient, idempotency key) sent. Storage only: the store decides who
    may take a message and wakes the recipient."""

    ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    unread: dict[int, list[Message]] = field(default_factory=dict)
    keys: dict[tuple[int, str], int] = field(default_factory=dict)

    def append(
        self,
        task_id: int,
        sender: int | None,
        kind: MessageKind,
        body: str,
        now: datetime,
        trace: str | None = None,
    ) -> int:
        """Store a message (``body`` is encoded JSON) at the end of the inbox; its id."""
        message = Message(next(self.ids), task_id, sender, kind, codec.decode(body), now, trace)
        self.unread.setdefault(task_id, []).append(message)
        return message.id

    def holds(self, task_id: int) -> bool:
        """Whether the task has unread messages."""
        return bool(self.unread.get(task_id))

    def read(self, task_id: int) -> list[Message]:
        return list(self.unread.get(task_id, ()))

    def consume(self, task_id: int, ids: Collection[int]) -> None:
        """Drop these messages (those a poll saw) from the task's inbox."""
        self.unread[task_id] = [m for m in self.unread.get(task_id, ()) if m.id not in ids]


# -- pauses ----------------------------------------------------------------------


@dataclass
class Pauses:
    """Paused queues and task names, by (kind, name). Not locked here: the
    store calls these under its own lock."""

    held: dict[tuple[PauseKind, str], datetime] = field(default_factory=dict)

    def pause(self, kind: PauseKind, name: str, now: datetime) -> bool:
        if (kind, name) in self.held:
            return False
        self.held[(kind, name)] = now
        return True

    def resume(self, kind: PauseKind, name: str) -> bool:
        return self.held.pop((kind, name), None) is not None

    def listed(self) -> list[Pause]:
        return [Pause(kind, name, at) for (kind, name), at in sorted(self.held.items())]

    def serves(self, queue: str, name: str) -> bool:
        """Whether neither ``queue`` nor task ``name`` is paused."""
        return (PauseKind.QUEUE, queue) not in self.held and (
            PauseKind.TASK,
            name,
        ) not in self.held

    def served(self, names: set[str], queues: set[str]) -> tuple[set[str], set[str]]:
        """``names`` and ``queues`` without the paused ones."""
        if not self.held:
            return names, queues
        return (
            {n for n in names if (PauseKind.TASK, n) not in self.held},
            {q for q in queues if (PauseKind.QUEUE, q) not in self.held},
        )


# -- concurrency keys and unique keys ------------------------------------------------

UNLIMITED = 1_000_000
"""The running limit of a key that only has a rate."""


@dataclass
class KeyRow:
    """A key's row: its limit, when a claim last took a task of it, and its
    rate bucket (``tokens`` as of ``refilled_at``)."""

    max_running: int
    claimed_at: datetime | None = None
    rate_limit: int | None = None
    rate_period: float | None = None
    tokens: float | None = None
    refilled_at: datetime | None = None

    def tokens_at(self, now: datetime) -> float | None:
        """The bucket's tokens at ``now`` (None: no rate)."""
        if self.rate_limit is None or self.rate_period is None or self.tokens is None:
            return None
        elapsed = (now - (self.refilled_at or now)).total_seconds()
        refill = elapsed * self.rate_limit / self.rate_period
        return min(float(self.rate_limit), self.tokens + refill)


def ensure_key(store: Tables, row: Row, now: datetime | None = None) -> None:
    """``row`` became pending: its key has a row (a new one with a full
    bucket). A key none of whose other tasks is pending takes ``row``'s
    running limit, as a new row would: whether a claim dropped the key's row
    meanwhile (see :func:`settle`) changes nothing."""
    key = row.concurrency_key
    if key is None or row.state is not TaskState.PENDING:
        return
    limit = row.concurrency_limit or UNLIMITED
    found = store.concurrency.get(key)
    if found is None:
        store.concurrency[key] = KeyRow(
            limit,
            rate_limit=row.rate_limit,
            rate_period=row.rate_period,
            tokens=None if row.rate_limit is None else float(row.rate_limit),
            refilled_at=now,
        )
    elif found.max_running != limit and not any(
        task_id != row.id for task_id in store.index.keyed_pending.get(key, ())
    ):
        found.max_running = limit


def release_key(store: Tables, row: Row) -> None:
    """``row`` gives its key up: the next enqueue of it stores a new task."""
    if row.idempotency_key is not None:
        store.keys.pop((row.name, row.idempotency_key), None)
        row.idempotency_key = None


# -- dependencies -------------------------------------------------------------------


@dataclass(slots=True)
class Edge:
    """One dependency of a task: the task it waits for, and whether that
    task's end was counted (once: a manual retry of it moves nothing again)."""

    task_id: int
    settled: bool = False


@dataclass
class Dependencies:
    """Each dependent's edges in the order given, and each dependency's
    edges by (dependent, position): what an end settles, found without a
    scan of the dependent's other edges (a chord's callback has one per
    member)."""

    edges: dict[int, list[Edge]] = field(default_factory=dict)
    dependents: dict[int, list[tuple[int, int]]] = field(default_factory=dict)

    def add(self, dependent: int, dependencies: Collection[int]) -> None:
        self.edges[dependent] = [Edge(task_id) for task_id in dependencies]
        for position, task_id in enumerate(dependencies):
            self.dependents.setdefault(task_id, []).append((dependent, position))

    def unsettled(self, dependency: int) -> list[tuple[int, Edge]]:
        """The edges not settled yet of which ``dependency`` is the task waited for."""
        found = []
        for dependent, position in self.dependents.get(dependency, ()):
            edges = self.edges.get(dependent)
            if edges is not None and not edges[position].settled:
                found.append((dependent, edges[position]))
        return found

    def waited_by(self, dependency: int) -> list[int]:
        """The tasks that wait (or waited) for ``dependency``."""
        return list(dict.fromkeys(d for d, _ in self.dependents.get(dependency, ())))

    def forget(self, task_id: int) -> None:
        """A task is deleted: its own edges go; edges to it stay (a reader
        finds it no longer stored)."""
        for edge in self.edges.pop(task_id, ()):
            waiting = self.dependents.get(edge.task_id)
            if waiting is not None:
                waiting[:] = [(d, p) for d, p in waiting if d != task_id]
        self.dependents.pop(task_id, None)


# -- schedules ---------------------------------------------------------------------


@dataclass(slots=True)
class ScheduleRelease:
    """A release of schedules as the store records it: its generation (the
    order of first syncs), its task names, and its last sync."""

    generation: int
    tasks: frozenset[str]
    seen_at: datetime


# -- the tables --------------------------------------------------------------------


@dataclass
class Tables:
    """Tasks by id and the indexes a claim reads, inboxes, idempotency keys
    and workers. The backend wrapping a store tells idle workers what its
    writes made due, and running ones what was cancelled: :meth:`take_wakeups`."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    tasks: dict[int, Row] = field(default_factory=dict)
    workers: dict[str, WorkerInfo] = field(default_factory=dict)
    index: ClaimIndex = field(default_factory=ClaimIndex)
    inboxes: Inboxes = field(default_factory=Inboxes)
    children: dict[int, set[int]] = field(default_factory=dict)
    woken: set[str] = field(default_factory=set)
    """Queues where tasks became due under the lock; notified after it."""
    keys: dict[tuple[str, str], int] = field(default_factory=dict)
    """Task ids by (name, idempotency key)."""
    cancelling: set[int] = field(default_factory=set)
    """Running tasks whose cancel was requested under the lock; their
    workers are told after it."""
    pauses: Pauses = field(default_factory=Pauses)
    schedules: dict[str, StoredSchedule] = field(default_factory=dict)
    releases: dict[str, ScheduleRelease] = field(default_factory=dict)
    """The schedule releases synced so far, by name (see :mod:`.flow`)."""
    concurrency: dict[str, KeyRow] = field(default_factory=dict)
    """Concurrency keys with pending tasks (see :mod:`.flow`)."""
    dependencies: Dependencies = field(default_factory=Dependencies)

    # -- the moves every section shares: the only writes of a task's state ------

    def _move(self, row: Row, cause: Cause, state: TaskState) -> None:
        """Move ``row`` to ``state`` because of ``cause`` and keep the claim
        indexes (a pending row is indexed at its ``run_at``, set before).
        Raises IllegalStateChangeError for a move the table does not list."""
        check_state_change(row.state, cause, state)
        row.state = state
        self.index.update(row)
        ensure_key(self, row)
        if row.leaves_unique_scope():
            release_key(self, row)

    def take_wakeups(self) -> tuple[set[str], set[int]]:
        """The queues where tasks became due and the running tasks whose
        cancel was requested since the last call (then forgotten)."""
        with self.lock:
            woken, self.woken = self.woken, set()
            cancelling, self.cancelling = self.cancelling, set()
        return woken, cancelling

    def _row(self, task_id: int) -> Row:
        row = self.tasks.get(task_id)
        if row is None:
            raise TaskNotFoundError(f"no task with id {task_id}")
        return row

    def _deliver(
        self,
        row: Row,
        sender: int | None,
        kind: MessageKind,
        body: str,
        now: datetime,
        trace: str | None = None,
    ) -> int:
        """Put a message in ``row``'s inbox and wake it (the caller checked it takes one)."""
        message_id = self.inboxes.append(row.id, sender, kind, body, now, trace)
        self._wake(row, now)
        return message_id

    def _wake(self, row: Row, now: datetime) -> None:
        """A message arrived: a waiting task is pending again, a sleeping one
        due now (its run time never moves later)."""
        if row.state is TaskState.WAITING or (row.state is TaskState.PENDING and row.run_at > now):
            row.run_at = min(row.run_at, now)
            self._move(row, Cause.MESSAGE, TaskState.PENDING)
            self.woken.add(row.queue)

    def _ended(self, row: Row, now: datetime) -> None:
        """``row`` reached a terminal state: its live parent gets its end
        message; a cancelled coroutine's live children are cancelled too;
        its dependents count its end (see :meth:`_count_end`), and those
        that this ends move theirs in turn (a worklist, not a recursion:
        a chain may be long)."""
        ended = [row]
        while ended:
            one = ended.pop()
            self._tell_parent(one, now)
            ended += self._settle(one, now)

    def _settle(self, dependency: Row, now: datetime) -> list[Row]:
        """Count ``dependency``'s end in every edge to it not settled yet;
        the dependents that this ends (their own ends are the caller's)."""
        ended = []
        for dependent_id, edge in self.dependencies.unsettled(dependency.id):
            edge.settled = True
            dependent = self.tasks.get(dependent_id)
            if dependent is not None and self._count_end(dependent, dependency.state, now):
                ended.append(dependent)
        return ended

    def _count_end(self, row: Row, state: TaskState, now: datetime) -> bool:
        """A dependency of ``row`` ended in ``state``: whether that ends
        ``row`` (its policy and a failed or cancelled dependency), else
        ``row`` counts it and is pending at the last one."""
        if row.state is not TaskState.WAITING or not row.waiting_for:
            return False
        if state is TaskState.SUCCEEDED or row.after_policy == "run":
            row.waiting_for -= 1
            if row.waiting_for == 0:
                row.run_at = max(row.run_at, now)
                self._move(row, Cause.DEPENDENCY, TaskState.PENDING)
                self.woken.add(row.queue)
            return False
        failed = row.after_policy == "fail"
        self._move(row, Cause.DEPENDENCY, TaskState.FAILED if failed else TaskState.CANCELLED)
        row.finished_at = now
        return True

    def _tell_parent(self, row: Row, now: datetime) -> None:
        """``row`` ended: its live parent gets its end message; a cancelled
        coroutine's live children are cancelled."""
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
            self._deliver(parent, row.id, MessageKind.END, body, now)
        if row.state is TaskState.CANCELLED:
            for child_id in sorted(self.children.get(row.id, ())):
                self._cancel(self.tasks[child_id], now)

    def _cancel(self, row: Row, now: datetime) -> None:
        if row.state in (TaskState.PENDING, TaskState.WAITING):
            self._move(row, Cause.CANCEL, TaskState.CANCELLED)
            row.finished_at = now
            self._ended(row, now)
        elif row.state is TaskState.IN_PROGRESS:
            self._move(row, Cause.CANCEL, TaskState.IN_PROGRESS)
            row.cancel_requested = True
            self.cancelling.add(row.id)
