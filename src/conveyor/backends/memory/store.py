"""The memory store: the task state machine, written as plain Python.

Tasks with their attempt logs, inboxes and workers, held in this process.
Every operation of a backend is one method here: pure and synchronous (no
I/O, no event loop, no clock: each write takes ``now``), and atomic (each
takes the store's lock for its whole run, as a SQL backend runs one
transaction).

This is the reference model of the SQL backends: the Hypothesis state
machine of ``tests/conformance/test_state_machine.py`` drives it and a SQL
backend with the same operations and clock, and compares every answer and
every stored row. What the docstrings below guarantee, the SQL backends
guarantee too.

Every change of a task's state goes through :meth:`Store._move`, which
checks it against :data:`conveyor.model.STATE_CHANGES`: a move the table
does not list raises :class:`~conveyor.model.IllegalStateChangeError`, a
bug in conveyor (``docs/state_machine.md`` explains the table).
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from conveyor import payload as codec
from conveyor.backends.memory import keys as concurrency_keys
from conveyor.backends.memory import unique
from conveyor.backends.memory.flow import Pauses
from conveyor.backends.memory.inboxes import Inboxes
from conveyor.backends.memory.index import ClaimIndex
from conveyor.backends.memory.rows import Row
from conveyor.backends.params import (
    ClaimedTask,
    ClaimParams,
    Completion,
    Delivery,
    Effects,
    ErrorInfo,
    FinishParams,
    FinishResult,
    HeartbeatParams,
    HeartbeatResult,
    NewTask,
)
from conveyor.backends.stored import (
    LEASE_EXPIRED,
    LEASE_EXPIRED_ERROR,
    check_recipient,
    lease_lost_message,
)
from conveyor.errors import InvalidTransitionError, TaskNotFoundError
from conveyor.model import (
    LeaseToken,
    MessageKind,
    Outcome,
    Pause,
    PauseKind,
    TaskState,
)
from conveyor.records import CancelMany, RetryMany, StoredSchedule, TaskSelection, WorkerInfo
from conveyor.states import Cause, IllegalStateChangeError, check_state_change

_COMPLETION_CAUSES = {
    TaskState.SUCCEEDED: Cause.SUCCEED,
    TaskState.FAILED: Cause.FAIL,
    TaskState.CANCELLED: Cause.CANCEL,
    TaskState.WAITING: Cause.SUSPEND,
}


@dataclass(slots=True)
class ScheduleRelease:
    """A release of schedules as the store records it: its generation (the
    order of first syncs), its task names, and its last sync."""

    generation: int
    tasks: frozenset[str]
    seen_at: datetime


@dataclass
class Store:
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
    """The schedule releases synced so far, by name (see :mod:`.schedules`)."""
    concurrency: dict[str, concurrency_keys.KeyRow] = field(default_factory=dict)
    """Concurrency keys with pending tasks (see :mod:`.keys`)."""

    # -- state changes: the only writes of a task's state ----------------------

    def _move(self, row: Row, cause: Cause, state: TaskState) -> None:
        """Move ``row`` to ``state`` because of ``cause`` and keep the claim
        indexes (a pending row is indexed at its ``run_at``, set before).
        Raises IllegalStateChangeError for a move the table does not list."""
        check_state_change(row.state, cause, state)
        row.state = state
        self.index.update(row)
        concurrency_keys.ensure(self, row)
        if row.leaves_unique_scope():
            unique.release(self, row)

    def take_wakeups(self) -> tuple[set[str], set[int]]:
        """The queues where tasks became due and the running tasks whose
        cancel was requested since the last call (then forgotten)."""
        with self.lock:
            woken, self.woken = self.woken, set()
            cancelling, self.cancelling = self.cancelling, set()
        return woken, cancelling

    # -- enqueue ---------------------------------------------------------------

    def enqueue(self, tasks: Iterable[NewTask], now: datetime) -> list[int]:
        """Store every task, pending at its ``run_at`` (else ``delay`` seconds
        from ``now``), and return their ids in order. A task whose name and
        unique key are held by a stored task is not stored (nor its first
        message): by its ``on_conflict``, the holder's id comes back, the
        pending holder takes its payload, priority and due time, or
        TaskExistsError is raised and nothing is stored."""
        with self.lock:
            batch = list(tasks)
            unique.refuse_held(self, batch, now)
            mine: set[int] = set()
            return [self._insert(new, now, Cause.ENQUEUE, mine).id for new in batch]

    def _insert(
        self, new: NewTask, now: datetime, cause: Cause, mine: set[int] | None = None
    ) -> Row:
        """Store ``new`` (or find the holder of its key); ``mine`` collects the
        ids this enqueue stored (a key repeated in it is its first task's)."""
        key = new.idempotency_key
        if key is not None:
            holder = unique.holder(self, new.name, key, now)
            if holder is not None:
                if mine is not None and holder.id in mine:
                    return holder
                return unique.conflict(self, holder, new, now)
        check_state_change(None, cause, TaskState.PENDING)
        row = Row.new(next(self.ids), new, now)
        self.tasks[row.id] = row
        concurrency_keys.ensure(self, row, now)
        if mine is not None:
            mine.add(row.id)
        if key is not None:
            self.keys[(new.name, key)] = row.id
        self.index.update(row)
        if new.parent_id is not None:
            self.children.setdefault(new.parent_id, set()).add(row.id)
        if new.message is not None:  # its first input: it does not move a delayed start
            self.inboxes.append(
                row.id, new.parent_id, MessageKind.MESSAGE, new.message, now, new.trace
            )
        return row

    # -- claim, heartbeat -------------------------------------------------------

    def claim(self, params: ClaimParams, now: datetime) -> list[ClaimedTask]:
        """Hand up to ``limit`` tasks of these names and queues to the worker,
        in claim order (priority desc, run_at, id): due pending tasks, and
        expired leases with budget left and no cancel requested (reclaimed:
        the lost attempt is closed ``lease_lost``). Each starts a new attempt
        (number and spent budget one up) under a lease of its own length, else
        the claim's. Every expired lease of these names and queues whose
        budget is spent, or whose cancel was requested, ends its task
        (``failed``, ``cancelled``) without taking a place in the limit."""
        if params.limit <= 0:
            return []
        with self.lock:
            names, queues = self.pauses.served(set(params.names), set(params.queues))
            candidates = [
                row
                for task_id in list(self.index.in_progress)
                if (row := self.tasks[task_id]).name in names
                and row.queue in queues
                and row.lease_expires_at is not None
                and row.lease_expires_at <= now
                and self._reclaimable(row, now)
            ]
            for queue in queues:
                candidates += self.index.due(self.tasks, queue, names, now, params.limit)
            keyed, read = concurrency_keys.keyed_due(self, names, queues, now, params.limit)
            candidates += keyed
            candidates.sort(key=lambda r: (-r.priority, r.run_at, r.id))
            chosen = candidates[: params.limit]
            # A reclaim is not limited by its key: it replaces an admitted attempt.
            admitted = {row.id for row in keyed}
            keyed_taken = [row for row in chosen if row.id in admitted]
            handed = [self._hand_out(row, params, now) for row in chosen]
            concurrency_keys.settle(self, read, keyed_taken, now)
            return handed

    def _reclaimable(self, row: Row, now: datetime) -> bool:
        """An expired lease: True if its task may run again; else its task
        ends here, its lost attempt closed with the reason."""
        if row.cancel_requested or row.spent >= row.max_attempts:
            message = lease_lost_message(row.cancel_requested, row.spent, row.max_attempts)
            row.close_attempt(now, Outcome.LEASE_LOST, ErrorInfo(LEASE_EXPIRED_ERROR, message))
            ended = TaskState.CANCELLED if row.cancel_requested else TaskState.FAILED
            self._move(row, Cause.RECLAIM, ended)
            row.end_lease()
            row.finished_at = now
            self._ended(row, now)
            return False
        return True

    def _hand_out(self, row: Row, params: ClaimParams, now: datetime) -> ClaimedTask:
        if row.state is TaskState.IN_PROGRESS:
            lost = ErrorInfo(LEASE_EXPIRED_ERROR, LEASE_EXPIRED)
            row.close_attempt(now, Outcome.LEASE_LOST, lost)
            self._move(row, Cause.RECLAIM, TaskState.IN_PROGRESS)
        else:
            self._move(row, Cause.CLAIM, TaskState.IN_PROGRESS)
        row.start_attempt(params.worker_id, params.lease, now)
        return row.claimed()

    def heartbeat(self, params: HeartbeatParams, now: datetime) -> HeartbeatResult:
        """Extend exactly the leases this worker still holds (this attempt,
        this worker, not expired) by the task's lease length, else the
        heartbeat's; every other token is lost. Marks the worker seen, and
        says whether it is registered."""
        renewed, cancel = set(), set()
        with self.lock:
            worker = self.workers.get(params.worker_id)
            if worker is not None:
                self.workers[worker.id] = dataclasses.replace(worker, last_seen_at=now)
            for token in params.tokens:
                row = self.tasks.get(token.task_id)
                if row is not None and row.live(token.attempt, params.worker_id, now):
                    row.lease_expires_at = now + timedelta(seconds=row.lease or params.lease)
                    renewed.add(token)
                    if row.cancel_requested:
                        cancel.add(token)
        return HeartbeatResult(
            frozenset(renewed),
            frozenset(params.tokens) - renewed,
            frozenset(cancel),
            worker is not None,
        )

    def cancel_requested(
        self, worker_id: str, tokens: Sequence[LeaseToken]
    ) -> frozenset[LeaseToken]:
        """The tokens, of this worker's current attempts, whose task's cancel
        was requested. Reads only."""
        with self.lock:
            return frozenset(
                t
                for t in tokens
                if (row := self.tasks.get(t.task_id)) is not None
                and row.attempt == t.attempt
                and row.worker_id == worker_id
                and row.cancel_requested
            )

    # -- finish ----------------------------------------------------------------

    def finish(self, params: FinishParams, now: datetime) -> FinishResult:
        """Apply each completion whose lease is live (fenced as a heartbeat);
        the others change nothing and come back rejected.

        As on the SQL backends: first every applied poll's effects (messages
        consumed, children spawned, messages sent: a child's last messages
        precede its end), then the completions, then the endings (end
        messages, cascading cancels), then a resting poll whose inbox still
        holds messages is due again. A completion that would make a task
        pending or waiting after its cancel was requested ends it cancelled
        (its run time stays). A new state (a next step, a coroutine's rest)
        comes with a fresh budget; an ``interrupted`` attempt is given back."""
        applied: set[LeaseToken] = set()
        with self.lock:
            holding = [
                (row, c)
                for c in params.completions
                if (row := self.tasks.get(c.token.task_id)) is not None
                and row.live(c.token.attempt, params.worker_id, now)
            ]
            for row, c in holding:
                if c.effects is not None:
                    self._apply(row, c.effects, now)
            # Endings come after every completion of the call, as the SQL
            # backends' row triggers fire after their statement: a child
            # ending beside its parent finds the parent ended, whatever the
            # order of the completions.
            ended = [row for row, c in holding if self._finish_one(row, c, now)]
            applied.update(c.token for _, c in holding)
            for row in ended:
                self._ended(row, now)
            for row, c in holding:
                if c.effects is not None and self.inboxes.holds(row.id):
                    self._wake(row, now)
        tokens = frozenset(c.token for c in params.completions)
        return FinishResult(frozenset(applied), tokens - applied)

    def _finish_one(self, row: Row, c: Completion, now: datetime) -> bool:
        """Apply one completion; whether the task ended (its ending is the
        caller's to run)."""
        state = c.next_state
        if row.cancel_requested and state in (TaskState.PENDING, TaskState.WAITING):
            state = TaskState.CANCELLED
        cause = _ending_cause(c, state)
        if state is TaskState.SUCCEEDED:
            row.result = c.result
        if c.outcome is Outcome.INTERRUPTED:
            row.spent -= 1
        move = c.transition
        if move is not None:  # its run time is set only if the task is pending again
            row.take_state(move)
        if state is TaskState.PENDING:
            row.run_at = (
                (move.run_at or now + timedelta(seconds=move.delay))
                if move is not None
                else now + timedelta(seconds=c.retry_delay or 0.0)
            )
        self._move(row, cause, state)
        if state is TaskState.PENDING and row.run_at <= now:  # a next step, a release
            self.woken.add(row.queue)
        row.end_lease()
        concurrency_keys.freed(self, row, now)
        row.finished_at = now if state.is_terminal else None
        row.close_attempt(now, c.outcome, c.error)
        return state.is_terminal

    def _apply(self, row: Row, effects: Effects, now: datetime) -> None:
        """A poll's consumed messages, spawns and sends (a send to a task
        that is missing, finished or has no inbox is dropped)."""
        self.inboxes.consume(row.id, set(effects.consumed))
        for new in effects.spawns:
            self._insert(dataclasses.replace(new, parent_id=row.id), now, Cause.SPAWN)
            self.woken.add(new.queue)
        for send in effects.sends:
            target = self.tasks.get(send.task_id)
            if target is not None and target.inbox and not target.state.is_terminal:
                self._deliver(target, row.id, MessageKind.MESSAGE, send.body, now, send.trace)

    def _ended(self, row: Row, now: datetime) -> None:
        """``row`` reached a terminal state: its live parent gets its end
        message; a cancelled coroutine's live children are cancelled too."""
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

    # -- messages --------------------------------------------------------------

    def send(self, deliveries: Sequence[Delivery], now: datetime) -> list[int]:
        """Deliver every message, all or none, and return their ids: raises
        TaskNotFoundError, NoInboxError or TaskFinishedError (nothing sent)
        for a recipient that cannot take one. A waiting recipient is pending
        again, a sleeping one due now. A delivery whose idempotency key this
        recipient was sent under already delivers nothing: the first
        message's id comes back."""
        with self.lock:
            sent = {
                index: self.inboxes.keys[(d.task_id, d.idempotency_key)]
                for index, d in enumerate(deliveries)
                if d.idempotency_key is not None
                and (d.task_id, d.idempotency_key) in self.inboxes.keys
            }
            targets = {
                index: self._recipient(d.task_id)
                for index, d in enumerate(deliveries)
                if index not in sent
            }
            ids = []
            for index, d in enumerate(deliveries):
                if index in sent:
                    ids.append(sent[index])
                    continue
                message_id = self._deliver(
                    targets[index], d.sender_id, MessageKind.MESSAGE, d.body, now, d.trace
                )
                if d.idempotency_key is not None:
                    self.inboxes.keys[(d.task_id, d.idempotency_key)] = message_id
                ids.append(message_id)
            return ids

    def _recipient(self, task_id: int) -> Row:
        row = self.tasks.get(task_id)
        check_recipient(task_id, row.state if row else None, row is not None and row.inbox)
        assert row is not None
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

    # -- control -----------------------------------------------------------------

    def cancel(self, task_id: int, now: datetime) -> TaskState:
        """Cancel a task and return its state after: a pending or waiting one
        ends ``cancelled``; a running one stays ``in_progress`` with its
        cancel requested (its worker is told). A cancelled coroutine's live
        children are cancelled too. Raises TaskNotFoundError, or
        InvalidTransitionError for a finished task."""
        with self.lock:
            row = self._row(task_id)
            if row.state.is_terminal:
                raise InvalidTransitionError(f"cannot cancel task {task_id}: it is {row.state}")
            self._cancel(row, now)
            return row.state

    def _cancel(self, row: Row, now: datetime) -> None:
        if row.state in (TaskState.PENDING, TaskState.WAITING):
            self._move(row, Cause.CANCEL, TaskState.CANCELLED)
            row.finished_at = now
            self._ended(row, now)
        elif row.state is TaskState.IN_PROGRESS:
            self._move(row, Cause.CANCEL, TaskState.IN_PROGRESS)
            row.cancel_requested = True
            self.cancelling.add(row.id)

    def retry(self, task_id: int, now: datetime) -> TaskState:
        """Make a failed or cancelled task pending, due ``now``, with a fresh
        budget (attempt numbers go on). Raises TaskNotFoundError, or
        InvalidTransitionError for a task in any other state."""
        with self.lock:
            row = self._row(task_id)
            if row.state not in (TaskState.FAILED, TaskState.CANCELLED):
                raise InvalidTransitionError(f"cannot retry task {task_id}: it is {row.state}")
            row.spent, row.run_at = 0, now
            self._move(row, Cause.MANUAL_RETRY, TaskState.PENDING)
            row.cancel_requested, row.result, row.finished_at = False, None, None
            return row.state

    def run_now(self, task_id: int, now: datetime) -> TaskState:
        """A pending task becomes due ``now`` (never later). Raises
        TaskNotFoundError, or InvalidTransitionError for any other state."""
        with self.lock:
            row = self._row(task_id)
            if row.state is not TaskState.PENDING:
                raise InvalidTransitionError(f"cannot run now task {task_id}: it is {row.state}")
            if row.run_at > now:
                row.run_at = now
                self.index.update(row)
            self.woken.add(row.queue)
            return row.state

    def retry_many(self, selection: RetryMany, now: datetime) -> list[int]:
        """One batch of a bulk retry (see :class:`RetryMany`), each as :meth:`retry`."""
        with self.lock:
            chosen = self.selected(selection)
            for task_id in chosen:
                row = self.tasks[task_id]
                row.spent, row.run_at = 0, now
                self._move(row, Cause.MANUAL_RETRY, TaskState.PENDING)
                row.cancel_requested, row.result, row.finished_at = False, None, None
                self.woken.add(row.queue)
            return chosen

    def cancel_many(self, selection: CancelMany, now: datetime) -> list[int]:
        """One batch of a bulk cancel (see :class:`CancelMany`), each as :meth:`cancel`."""
        with self.lock:
            chosen = self.selected(selection)
            for task_id in chosen:
                row = self.tasks.get(task_id)
                if row is not None and not row.state.is_terminal:  # a child cancelled before
                    self._cancel(row, now)
            return chosen

    def selected(self, selection: TaskSelection) -> list[int]:
        """The ids of the tasks ``selection`` takes now (the caller holds the lock)."""
        states = set(selection.states)
        among = None if selection.ids is None else set(selection.ids)
        return sorted(
            row.id
            for row in self.tasks.values()
            if row.state in states
            and row.id > selection.after
            and (among is None or row.id in among)
            and selection.name in (None, row.name)
            and selection.queue in (None, row.queue)
            and (selection.since is None or row.created_at >= selection.since)
            and (selection.until is None or row.created_at < selection.until)
        )[: selection.limit]

    def _row(self, task_id: int) -> Row:
        row = self.tasks.get(task_id)
        if row is None:
            raise TaskNotFoundError(f"no task with id {task_id}")
        return row

    # -- pauses ------------------------------------------------------------------

    def pause(self, kind: PauseKind, name: str, now: datetime) -> bool:
        with self.lock:
            return self.pauses.pause(kind, name, now)

    def resume(self, kind: PauseKind, name: str) -> bool:
        """Undo a pause; the queues it held back are woken."""
        with self.lock:
            if not self.pauses.resume(kind, name):
                return False
            self.woken.update(
                row.queue
                for row in self.tasks.values()
                if row.state is TaskState.PENDING
                and (row.queue == name if kind is PauseKind.QUEUE else row.name == name)
            )
            return True

    def list_pauses(self) -> list[Pause]:
        with self.lock:
            return self.pauses.listed()

    # -- workers -----------------------------------------------------------------

    def register_worker(self, info: WorkerInfo, now: datetime) -> None:
        with self.lock:
            self.workers[info.id] = dataclasses.replace(
                info, started_at=now, last_seen_at=now, stopped_at=None
            )

    def stop_worker(self, worker_id: str, now: datetime) -> None:
        with self.lock:
            found = self.workers.get(worker_id)
            if found is not None:
                self.workers[worker_id] = dataclasses.replace(
                    found, stopped_at=now, last_seen_at=now
                )


def _ending_cause(c: Completion, state: TaskState) -> Cause:
    """Why an applied completion moves its task to ``state`` (after the
    cancel rule); IllegalStateChangeError for a state no completion reaches."""
    if state is TaskState.PENDING:
        if c.transition is not None:
            return Cause.NEXT_STEP if c.transition.step is not None else Cause.SLEEP
        return Cause.RELEASE if c.outcome is Outcome.INTERRUPTED else Cause.RETRY
    cause = _COMPLETION_CAUSES.get(state)
    if cause is None:
        raise IllegalStateChangeError(
            f"no completion of an attempt moves its task to {state.value}"
        )
    return cause
