"""The attempt lifecycle in memory: claim (with the reclaim of expired
leases), heartbeat, finish, and the cancel read of running attempts."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import datetime, timedelta

from conveyor.backends.memory.flow import freed, keyed_due, settle
from conveyor.backends.memory.messages import Messages
from conveyor.backends.memory.rows import Row
from conveyor.backends.params import (
    ClaimedTask,
    ClaimParams,
    Completion,
    ErrorInfo,
    FinishParams,
    FinishResult,
    HeartbeatParams,
    HeartbeatResult,
    ProgressParams,
)
from conveyor.backends.stored import LEASE_EXPIRED, LEASE_EXPIRED_ERROR, lease_lost_message
from conveyor.model import Cause, IllegalStateChangeError, LeaseToken, Outcome, TaskState

_COMPLETION_CAUSES = {
    TaskState.SUCCEEDED: Cause.SUCCEED,
    TaskState.FAILED: Cause.FAIL,
    TaskState.CANCELLED: Cause.CANCEL,
    TaskState.WAITING: Cause.SUSPEND,
}


class Attempts(Messages):
    """``claim``, ``heartbeat``, ``cancel_requested`` and ``finish``."""

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
            keyed, read = keyed_due(self, names, queues, now, params.limit)
            candidates += keyed
            candidates.sort(key=lambda r: (-r.priority, r.run_at, r.id))
            chosen = candidates[: params.limit]
            # A reclaim is not limited by its key: it replaces an admitted attempt.
            admitted = {row.id for row in keyed}
            keyed_taken = [row for row in chosen if row.id in admitted]
            handed = [self._hand_out(row, params, now) for row in chosen]
            settle(self, read, keyed_taken, now)
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
        return row.claimed(now)

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

    def report_progress(self, params: ProgressParams, now: datetime) -> frozenset[LeaseToken]:
        """Store each report whose lease is live (the heartbeat's fence)."""
        stored = set()
        with self.lock:
            for report in params.reports:
                row = self.tasks.get(report.token.task_id)
                if row is not None and row.live(report.token.attempt, params.worker_id, now):
                    row.progress, row.progress_at = report.text, now
                    stored.add(report.token)
        return frozenset(stored)

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
        freed(self, row, now)
        row.finished_at = now if state.is_terminal else None
        row.close_attempt(now, c.outcome, c.error)
        return state.is_terminal


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
