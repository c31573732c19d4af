"""Stored values back to domain objects, and the texts and errors every
backend reports alike.

Pure functions: no connection, no I/O. Each backend first brings its rows
to Python values (timestamps as aware datetimes), then maps them here.

The texts a store writes in the attempt log when it ends an attempt itself
(a reclaim, a spent crash budget, a quarantine, a task set aside) are defined here once, for
every backend: the memory store and SQLite's Python code use them directly,
and SQL statements name them as ``{text:NAME}`` (see :data:`SQL_TEXTS`),
composed in as SQL literals when the statements are loaded
(:mod:`conveyor.backends.sqlfiles`).
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from conveyor import payload as codec
from conveyor.backends.params import ClaimedTask, Completion, ErrorInfo
from conveyor.errors import (
    ConfigurationError,
    ConveyorError,
    InvalidTransitionError,
    NoInboxError,
    TaskFinishedError,
    TaskNotFoundError,
)
from conveyor.model import (
    MAX_ATTEMPTS,
    Attempt,
    LeaseToken,
    Message,
    MessageKind,
    Outcome,
    Progress,
    RetryPolicy,
    Task,
    TaskState,
    check_progress,
)
from conveyor.records import (
    ActivityBucket,
    DependencyRecord,
    StoredSchedule,
    TaskFilter,
    TaskSummary,
    last_error_of,
)

log = logging.getLogger("conveyor.backends")

LEASE_EXPIRED_ERROR = "LeaseExpired"
"""The error type of every attempt that lost its lease (outcome ``lease_lost``)."""
CORRUPT_TASK_ERROR = "CorruptTask"
"""The error type of the failed attempt a quarantine logs."""
LEASE_EXPIRED = "lease expired: the worker stopped heartbeating (crash, kill or stall)"
"""Why a reclaimed task's previous attempt ended."""
CANCELLED_MEANWHILE = "lease expired; the task was cancelled meanwhile"
"""Why an expired lease ended its task ``cancelled``: its cancel was requested."""
CRASH_BUDGET_SPENT = (
    "lease expired and the crash budget is spent ({spent} of {max_attempts} attempts): "
    "the worker stopped heartbeating (crash, kill or stall)"
)
"""Why an expired lease ended its task ``failed``; a template (see
:func:`lease_lost_message`)."""
CORRUPT_COUNTER = (
    "the task cannot be claimed: its attempt counter ({attempt}) or spent counter "
    "({spent}) stands at the limit of a 32-bit integer (written around conveyor)"
)
"""Why a quarantine ended a task ``failed``; a template (see
:func:`corrupt_counter_message`)."""
CORRUPT_FIELD = (
    "the task cannot run: its field {field} does not read ({value}): written around conveyor"
)
"""Why a store (Redis) set a task aside: a field of its hash is missing or
holds what no claim can compute with (NaN, an infinity, a number out of its
bounds, text); a template of the field's name and its stored value."""

SQL_TEXTS: Mapping[str, str] = {
    "lease_expired_error": LEASE_EXPIRED_ERROR,
    "corrupt_task_error": CORRUPT_TASK_ERROR,
    "lease_expired": LEASE_EXPIRED,
    "cancelled_meanwhile": CANCELLED_MEANWHILE,
    "crash_budget_spent": CRASH_BUDGET_SPENT,
    "corrupt_counter": CORRUPT_COUNTER,
    "corrupt_field": CORRUPT_FIELD,
}
"""The texts SQL statements name as ``{text:NAME}``. A template's holes
(``{spent}``) become the statement's columns of those names."""


def lease_lost_message(cancelled: bool, spent: int, max_attempts: int) -> str:
    """Why an expired lease ended its task instead of being reclaimed."""
    if cancelled:
        return CANCELLED_MEANWHILE
    return CRASH_BUDGET_SPENT.format(spent=spent, max_attempts=max_attempts)


def corrupt_counter_message(attempt: object, spent: object) -> str:
    """Why a task whose counter stands at the limit ended failed."""
    return CORRUPT_COUNTER.format(attempt=attempt, spent=spent)


def corrupt_field_message(field: str, value: str) -> str:
    """Why a task whose field ``field`` holds ``value`` (as shown) was set aside."""
    return CORRUPT_FIELD.format(field=field, value=value)


def transition_result(
    task_id: int, what: str, changed: str | None, current: str | None
) -> TaskState:
    """The state after a cancel or retry; if nothing changed, why (the task is
    missing, or its current state does not allow ``what``)."""
    if changed is not None:
        return TaskState(changed)
    if current is None:
        raise TaskNotFoundError(f"no task with id {task_id}")
    raise InvalidTransitionError(f"cannot {what} task {task_id}: it is {current}")


def schedule_args(stored: StoredSchedule, now: object) -> dict[str, object]:
    """The arguments of a backend's ``sync_schedule`` statement: ``stored``'s
    definition, and ``now`` (a time in the backend's own form, or None)."""
    return {
        "name": stored.name,
        "task": stored.task,
        "cron": stored.cron,
        "every": stored.every,
        "tz": stored.tz,
        "missed": stored.missed,
        "catch_up": stored.catch_up,
        "args": stored.args,
        "fingerprint": stored.fingerprint,
        "now": now,
    }


KEY_SCAN_PER_SLOT = 4
MIN_KEY_SCAN = 16


def filter_args(task_filter: TaskFilter) -> dict[str, Any]:
    """The statement arguments of a task list's filter (SQL backends)."""
    return {
        "state": task_filter.state.value if task_filter.state else None,
        "name": task_filter.name,
        "queue": task_filter.queue,
        "limit": task_filter.limit,
        "before": task_filter.before,
        "parent": task_filter.parent,
    }


def key_scan(limit: int) -> int:
    """How many concurrency keys a keyed claim for ``limit`` tasks reads at
    most: ``max(4 * limit, 16)``, the ones claimed from longest ago first."""
    return max(KEY_SCAN_PER_SLOT * limit, MIN_KEY_SCAN)


def check_bucket_seconds(bucket_seconds: object) -> int:
    """``bucket_seconds`` of :meth:`Inspector.activity`, checked: an integer
    of 1 or more, else ConfigurationError (before any read)."""
    if isinstance(bucket_seconds, bool) or not isinstance(bucket_seconds, int):
        raise ConfigurationError("bucket_seconds must be an integer")
    if bucket_seconds < 1:
        raise ConfigurationError("bucket_seconds must be 1 or more")
    return bucket_seconds


def activity_buckets(
    since: datetime, bucket_seconds: int, rows: Iterable[tuple[int, int, int]]
) -> list[ActivityBucket]:
    """Buckets from rows of (bucket number from ``since``, succeeded,
    failed), oldest first, empty ones left out."""
    return [
        ActivityBucket(since + timedelta(seconds=number * bucket_seconds), int(ok), int(bad))
        for number, ok, bad in sorted(rows)
        if ok or bad
    ]


def delete_refused(
    task_id: int, state: str | None, parent_state: str | None
) -> TaskNotFoundError | InvalidTransitionError:
    """Why a delete of task ``task_id`` (in ``state``, None if missing; its
    parent in ``parent_state``) deleted nothing."""
    if state is None:
        return TaskNotFoundError(f"no task with id {task_id}")
    if state == TaskState.IN_PROGRESS:
        return InvalidTransitionError(
            f"cannot delete task {task_id}: it is running; cancel it first"
        )
    return InvalidTransitionError(
        f"cannot delete task {task_id}: it is {state} and its parent is {parent_state}, "
        "waiting for its end; cancel it instead"
    )


def dependency_record(
    task_id: int,
    settled: bool,
    name: str | None = None,
    state: str | None = None,
    result: str | None = None,
    outcome: str | None = None,
    error_type: str | None = None,
    error_message: str | None = None,
) -> DependencyRecord:
    """A dependency as every engine reports it, from its stored columns
    (``state`` None: no longer stored): its result (decoded) only if it
    succeeded, the error of its latest ended attempt (``outcome``) only if
    the task did not succeed and that attempt did not either."""
    if state is None:
        return DependencyRecord(task_id, None, None, None, None, None, settled)
    task_state = TaskState(state)
    failed = task_state is not TaskState.SUCCEEDED and outcome not in (
        None,
        Outcome.SUCCEEDED.value,
        Outcome.IN_PROGRESS.value,
    )
    return DependencyRecord(
        task_id=task_id,
        name=name,
        state=task_state,
        result=(
            codec.decode_for_display(result)
            if task_state is TaskState.SUCCEEDED and result is not None
            else None
        ),
        error_type=error_type if failed else None,
        error_message=error_message if failed else None,
        settled=settled,
    )


def awaited_refusal(task_id: int) -> InvalidTransitionError:
    """Why a delete of task ``task_id`` deleted nothing: an unfinished task
    depends on it (and reads its outcome when it runs)."""
    return InvalidTransitionError(
        f"cannot delete task {task_id}: an unfinished task depends on it; "
        "cancel or delete that one first"
    )


def check_recipient(task_id: int, state: str | None, inbox: bool) -> None:
    """Raise why task ``task_id`` (in ``state``, None if missing) cannot take a message."""
    if state is None:
        raise TaskNotFoundError(f"no task with id {task_id}")
    if not inbox:
        raise NoInboxError(f"task {task_id} is not a coroutine task: it has no inbox")
    if TaskState(state).is_terminal:
        raise TaskFinishedError(f"task {task_id} has finished ({state}): it takes no messages")


@functools.lru_cache(maxsize=256)
def retry_json(policy: RetryPolicy) -> str:
    """A policy as stored (cached: a batch's tasks mostly share one)."""
    return codec.encode(policy.to_json())


@functools.lru_cache(maxsize=256)
def _retry_policy(text: str) -> RetryPolicy:
    return RetryPolicy.from_json(codec.decode(text))


def stored_retry_policy(text: str, max_attempts: int) -> RetryPolicy:
    """The stored policy; one that does not decode (written around conveyor)
    must not lose a claimed batch: the defaults apply, with the row's budget."""
    try:
        return _retry_policy(text)
    except Exception:
        log.error("a task's stored retry policy does not decode: %r; using defaults", text)
        return RetryPolicy(max_attempts=min(max(max_attempts, 1), MAX_ATTEMPTS))


@dataclass(frozen=True, slots=True)
class Unread:
    """A claimed row that does not read (written around conveyor): its lease
    token when its id and attempt read (the claim may then end it), and why."""

    token: LeaseToken | None
    why: str

    def completion(self) -> Completion | None:
        """The completion that ends it ``failed`` (``CorruptTask``), fenced
        by its token; None without one."""
        if self.token is None:
            return None
        return Completion(
            token=self.token,
            outcome=Outcome.FAILED,
            next_state=TaskState.FAILED,
            error=ErrorInfo(CORRUPT_TASK_ERROR, self.why),
        )


def claimed_rows(
    found: Iterable[Sequence[Any]],
    decode: Callable[[Sequence[Any]], ClaimedTask],
    worker_id: str,
    nonce: str = "",
) -> tuple[list[ClaimedTask], list[Unread]]:
    """Each row of a claim decoded on its own: one that does not read is set
    apart with why (and logged), never the rest of the claim. A row's first
    two columns are its task id and attempt number; ``nonce`` is the claim's
    part of every lease token (Redis; empty elsewhere)."""
    claimed: list[ClaimedTask] = []
    unread: list[Unread] = []
    for row in found:
        try:
            claimed.append(decode(row))
        except (ValueError, TypeError, LookupError, ArithmeticError, ConveyorError) as exc:
            why = f"a claimed row does not read (written around conveyor): {exc}"
            log.error("task %r: %s", row[0] if row else None, why)
            unread.append(Unread(_token(row, worker_id, nonce), why))
    return claimed, unread


def _token(row: Sequence[Any], worker_id: str, nonce: str) -> LeaseToken | None:
    try:
        task_id, attempt = int(row[0]), int(row[1])
    except (ValueError, TypeError, LookupError):
        return None
    return LeaseToken(task_id, attempt, worker_id, nonce)


CLAIM_COLUMNS = 17
"""The columns of a claim's row that :func:`claimed_task` reads before the
inbox a PostgreSQL claim may add."""


def claimed_task(row: Sequence[Any], worker_id: str) -> ClaimedTask:
    """A row of a claim: id, attempt, name, queue, payload, spent, max_attempts,
    retry policy, timeout, lease, lease expiry (a datetime), step, parent id,
    run time (a datetime), trace context, the task's expiry time when this
    claim started its first attempt past it (a datetime, else None; a hand-off's
    row stops before it), what it receives of its dependencies (PostgreSQL;
    else None or missing), and (PostgreSQL) the inbox read with the claim
    (see :func:`claimed_inbox`)."""
    task_id, attempt, name, queue, payload, spent, max_attempts, retry = row[:8]
    timeout, lease, expires, step, parent_id, run_at, trace = row[8:15]
    expired_at = row[15] if len(row) > 15 else None
    receives = row[16] if len(row) > 16 else None
    inbox = None
    if len(row) > CLAIM_COLUMNS and row[CLAIM_COLUMNS] is not None:
        inbox = claimed_inbox(task_id, row[CLAIM_COLUMNS])
    return ClaimedTask(
        token=LeaseToken(task_id=task_id, attempt=attempt, worker_id=worker_id),
        name=name,
        queue=queue,
        payload=payload,
        spent=spent,
        max_attempts=max_attempts,
        retry=stored_retry_policy(retry, max_attempts),
        timeout=timeout,
        lease=lease,
        lease_expires_at=expires,
        step=step,
        parent_id=parent_id,
        run_at=run_at,
        trace=trace,
        inbox=inbox,
        expired_at=expired_at,
        receives=receives,
    )


def claimed_inbox(task_id: int, rows: Any) -> list[Message] | None:
    """An inbox read with a claim: JSON rows of id, sender id, kind, body
    (JSON text), created_at (ISO 8601) and trace context. None if any row
    does not read (written around conveyor): the poll then reads its inbox
    itself, as without the claim's."""
    try:
        return [
            Message(
                id=int(message_id),
                task_id=task_id,
                sender_id=None if sender_id is None else int(sender_id),
                kind=MessageKind(kind),
                body=codec.decode(body),
                created_at=datetime.fromisoformat(created_at),
                trace=trace,
            )
            for message_id, sender_id, kind, body, created_at, trace in rows
        ]
    except Exception:
        return None


def attempt_row(row: tuple[Any, ...]) -> Attempt:
    return Attempt(
        task_id=row[0],
        number=row[1],
        worker_id=row[2],
        outcome=Outcome(row[3]),
        started_at=row[4],
        finished_at=row[5],
        error_type=row[6],
        error_message=row[7],
        traceback=row[8],
        step=row[9],
    )


def task_row(row: tuple[Any, ...], attempts: tuple[Attempt, ...]) -> Task:
    (
        task_id,
        name,
        queue,
        payload,
        state,
        priority,
        run_at,
        attempt,
        max_attempts,
        retry,
        timeout,
        lease,
        result,
        created_at,
        finished_at,
        worker_id,
        lease_expires_at,
        cancel_requested,
        step,
        parent_id,
        inbox,
        idempotency_key,
        concurrency_key,
    ) = row
    return Task(
        id=task_id,
        name=name,
        queue=queue,
        payload=codec.decode_for_display(payload),
        state=TaskState(state),
        priority=priority,
        run_at=run_at,
        attempt=attempt,
        max_attempts=max_attempts,
        retry=stored_retry_policy(retry, max_attempts),
        timeout=timeout,
        lease=lease,
        result=codec.decode_for_display(result) if result is not None else None,
        created_at=created_at,
        finished_at=finished_at,
        worker_id=worker_id,
        lease_expires_at=lease_expires_at,
        cancel_requested=cancel_requested,
        attempts=attempts,
        step=step,
        parent_id=parent_id,
        inbox=bool(inbox),
        idempotency_key=idempotency_key,
        concurrency_key=concurrency_key,
    )


def progress_text(done: int, total: int | None, note: str | None, attempt: int) -> str:
    """A progress report as every store holds it (one text field): JSON of
    its checked values and the attempt that reported it."""
    return json.dumps(
        {"done": done, "total": total, "note": note, "attempt": attempt},
        separators=(",", ":"),
        ensure_ascii=False,
    )


def progress_of(text: str | None, at: datetime | None) -> Progress | None:
    """The progress stored as ``text`` at ``at``; None when there is none,
    or when what is stored does not read as a report by the one rule
    (:func:`~conveyor.model.check_progress`: written around conveyor): a
    corrupt report is not shown, and hides nothing else of its task."""
    if text is None or at is None:
        return None
    try:
        value = json.loads(text)
        done, total, note = check_progress(value["done"], value["total"], value["note"])
        attempt = value["attempt"]
    except (ValueError, TypeError, KeyError, ConfigurationError):
        return None
    if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 0:
        return None
    return Progress(done, total, note, attempt, at)


def summary_row(row: Sequence[Any]) -> TaskSummary:
    """A row of ``list_summaries`` (PostgreSQL and SQLite, times already
    datetimes): the task's columns, then its latest attempt's outcome, error
    type and message (None: it has no attempt, or it is running)."""
    (
        task_id,
        name,
        queue,
        state,
        priority,
        run_at,
        attempt,
        max_attempts,
        created_at,
        finished_at,
        worker_id,
        cancel_requested,
        step,
        outcome,
        error_type,
        error_message,
    ) = row
    state = TaskState(state)
    return TaskSummary(
        id=task_id,
        name=name,
        queue=queue,
        state=state,
        priority=priority,
        run_at=run_at,
        attempt=attempt,
        max_attempts=max_attempts,
        created_at=created_at,
        finished_at=finished_at,
        worker_id=worker_id,
        cancel_requested=bool(cancel_requested),
        step=step,
        last_error=last_error_of(state, outcome, error_type, error_message),
    )


def message_row(row: tuple[Any, ...]) -> Message:
    """A row of an inbox: id, task id, sender id, kind, body (JSON text),
    created_at, the sender's trace context."""
    message_id, task_id, sender_id, kind, body, created_at, trace = row
    return Message(
        id=message_id,
        task_id=task_id,
        sender_id=sender_id,
        kind=MessageKind(kind),
        body=codec.decode(body),
        created_at=created_at,
        trace=trace,
    )
