"""A task as the memory store holds it: a mutable row, its fence, and the
domain objects read from it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from conveyor import payload as codec
from conveyor.backends import stored
from conveyor.backends.params import ClaimedTask, ErrorInfo, NewTask, Transition
from conveyor.model import Attempt, LeaseToken, Outcome, RetryPolicy, Task, TaskState


@dataclass
class Row:
    """A task as stored: the mutable twin of :class:`~conveyor.model.Task`.

    ``spent`` counts the attempts charged to the current budget (a manual
    retry and a new state reset it; an interrupted attempt is given back);
    ``attempt`` numbers every attempt ever made. Only the store's moves
    write ``state``."""

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
    unique_scope: str | None = None
    unique_until: datetime | None = None
    concurrency_key: str | None = None
    concurrency_limit: int | None = None
    rate_limit: int | None = None
    rate_period: float | None = None
    trace: str | None = None
    expires_at: datetime | None = None
    waiting_for: int | None = None
    after_policy: str = "cancel"
    receives: str | None = None
    progress: str | None = None
    progress_at: datetime | None = None
    attempts: list[Attempt] = field(default_factory=list)

    @classmethod
    def new(cls, task_id: int, new: NewTask, now: datetime) -> Row:
        """The row of a task enqueued (or spawned) at ``now``."""
        return cls(
            id=task_id,
            name=new.name,
            queue=new.queue,
            payload=new.payload,
            priority=new.priority,
            run_at=new.run_at or now + timedelta(seconds=new.delay),
            max_attempts=new.max_attempts,
            retry=new.retry,
            timeout=new.timeout,
            lease=new.lease,
            created_at=now,
            step=new.step,
            parent_id=new.parent_id,
            inbox=new.inbox,
            idempotency_key=new.idempotency_key,
            concurrency_key=new.concurrency_key,
            concurrency_limit=new.concurrency_limit,
            rate_limit=new.rate_limit,
            rate_period=new.rate_period,
            trace=new.trace,
            expires_at=new.expires_at,
            waiting_for=len(new.after) if new.after else None,
            after_policy=new.after_policy,
            receives=new.receives,
            unique_scope=new.unique_scope if new.idempotency_key is not None else None,
            unique_until=now + timedelta(seconds=new.unique_for)
            if new.unique_for is not None and new.idempotency_key is not None
            else None,
        )

    def leaves_unique_scope(self) -> bool:
        """Whether the state it just took ends its hold on its unique key."""
        if self.idempotency_key is None or self.unique_scope is None:
            return False
        return self.state.is_terminal or (
            self.unique_scope == "pending" and self.state is not TaskState.PENDING
        )

    def live(self, attempt: int, worker_id: str, now: datetime) -> bool:
        """The fence: this lease token, this owner, a lease not yet expired."""
        return (
            self.attempt == attempt
            and self.worker_id == worker_id
            and self.lease_expires_at is not None
            and self.lease_expires_at > now
        )

    def start_attempt(self, worker_id: str, lease: float, now: datetime) -> None:
        """A claim: the next attempt, charged to the budget, runs under a
        lease of ``lease`` seconds unless the task sets its own."""
        self.attempt += 1
        self.spent += 1
        self.worker_id = worker_id
        self.lease_expires_at = now + timedelta(seconds=self.lease or lease)
        self.attempts.append(
            Attempt(
                task_id=self.id,
                number=self.attempt,
                worker_id=worker_id,
                outcome=Outcome.IN_PROGRESS,
                started_at=now,
                step=self.step,
            )
        )

    def close_attempt(self, now: datetime, outcome: Outcome, error: ErrorInfo | None) -> None:
        """End the running attempt, the last of the log."""
        self.attempts[-1] = dataclasses.replace(
            self.attempts[-1],
            outcome=outcome,
            finished_at=now,
            error_type=error.type if error else None,
            error_message=error.message if error else None,
            traceback=error.traceback if error else None,
        )

    def end_lease(self) -> None:
        """The attempt is over: no owner, no lease."""
        self.worker_id = self.lease_expires_at = None

    def take_state(self, move: Transition) -> None:
        """A new state: the next step (None for a coroutine), its state and
        options, with a fresh budget (the run time is the caller's)."""
        self.step, self.payload, self.spent = move.step, move.state, 0
        self.max_attempts, self.retry = move.max_attempts, move.retry
        self.timeout, self.lease = move.timeout, move.lease

    def claimed(self, now: datetime) -> ClaimedTask:
        """What the worker that just claimed this row at ``now`` gets (its
        expiry time when this first attempt starts past it)."""
        assert self.worker_id is not None
        assert self.lease_expires_at is not None
        return ClaimedTask(
            token=LeaseToken(self.id, self.attempt, self.worker_id),
            name=self.name,
            queue=self.queue,
            payload=self.payload,
            spent=self.spent,
            max_attempts=self.max_attempts,
            retry=self.retry,
            timeout=self.timeout,
            lease=self.lease,
            lease_expires_at=self.lease_expires_at,
            step=self.step,
            parent_id=self.parent_id,
            run_at=self.run_at,
            trace=self.trace,
            expired_at=(
                self.expires_at
                if self.attempt == 1 and self.expires_at is not None and self.expires_at <= now
                else None
            ),
            receives=self.receives,
        )

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
            concurrency_key=self.concurrency_key,
            waiting_for=self.waiting_for,
            progress=stored.progress_of(self.progress, self.progress_at),
        )
