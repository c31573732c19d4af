"""Python values to script arguments, and stored Redis values back to domain
objects.

Pure functions: no connection, no I/O. Times are integer milliseconds since
the Unix epoch in Redis (a datetime is floored to its millisecond) and come
back as aware UTC datetimes. Optional script arguments travel as ``""``
for None and ``"="`` followed by the value otherwise, so that an empty
string stays a value.

A task's hash holds these fields (absent: None): ``name``, ``queue``,
``payload`` (JSON text), ``state``, ``priority``, ``run_at`` (ms),
``attempt`` (attempts ever made), ``spent`` (attempts charged to the
current budget), ``max_attempts``, ``retry`` (the policy as JSON),
``timeout`` and ``lease`` (seconds), ``created_at``, ``finished_at`` and
``lease_expires_at`` (ms), ``worker_id``, ``result`` (JSON text), ``step``,
``cancel_requested`` and ``inbox`` (``0``/``1``), ``parent_id``, and, for
a task holding a unique key, ``idempotency_key``, ``unique_scope`` and
``unique_until`` (ms); ``concurrency_key``, ``concurrency_limit``,
``rate_limit`` and ``rate_period`` (seconds) when given (see
``lua/lib/flow.lua``); ``expires_at`` (ms) when it expires; for a task
with dependencies, ``waiting_for`` (how many have not ended yet as its
policy counts them), ``after_policy`` and ``receives`` (when given), and
``dependents`` (``1``) on a task that some task depends on (see
``lua/lib/controls.lua``). An attempt row
is a JSON object with ``number``,
``worker_id``, ``outcome``, ``started_at``, ``finished_at``,
``error_type``, ``error_message``, ``traceback`` and ``step``. An inbox message is a JSON array (see
:func:`message`). A worker's hash holds ``host``, ``pid``, ``queues`` and
``tasks`` (JSON lists), ``concurrency``, ``started_at``, ``last_seen_at``
and ``stopped_at`` (ms) and ``beat_seconds``.

A task's field that does not read (missing, or not a number in its bounds:
written around conveyor) never fails a read: the task reads with a neutral
value there and says so in its payload (see :func:`task`); a claimed row
that does not read is set apart alone (see :func:`claimed_tasks`). Other
stored values that do not read (an attempt row, a message, a pause, a
worker) raise :class:`~conveyor.errors.BackendError` naming what and why,
never a bare KeyError or ValueError.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from conveyor import payload as codec
from conveyor.backends.params import ClaimedTask, Completion, Delivery, Effects, NewTask, Transition
from conveyor.backends.stored import (
    Unread,
    claimed_rows,
    dependency_record,
    progress_of,
    retry_json,
    stored_retry_policy,
)
from conveyor.errors import BackendError
from conveyor.model import (
    Attempt,
    LeaseToken,
    Message,
    MessageKind,
    Outcome,
    Pause,
    PauseKind,
    Progress,
    Task,
    TaskState,
)
from conveyor.records import (
    DependencyEdge,
    DependencyRecord,
    PruneParams,
    TaskSummary,
    WorkerInfo,
    last_error_of,
)

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MILLISECOND = timedelta(milliseconds=1)
TASK_FIELDS = 27
"""Arguments per task of ``enqueue.lua`` (and per spawn of ``finish.lua``)."""


def ms(moment: datetime) -> int:
    """A time as milliseconds since the epoch (floored; a naive one is taken as UTC)."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return (moment - EPOCH) // _MILLISECOND


def now_arg(moment: datetime | None) -> str:
    """The ``now`` of a script: the injected time, or "" for the server's clock."""
    return "" if moment is None else str(ms(moment))


def moment(value: int) -> datetime:
    return EPOCH + value * _MILLISECOND


def seconds_ms(seconds: float) -> int:
    """A duration in whole milliseconds (rounded)."""
    return round(seconds * 1000)


def opt(value: object) -> str:
    """An optional argument: "" for None, else "=" and the value."""
    return "" if value is None else f"={value}"


def _seconds(value: float | None) -> str | None:
    return None if value is None else repr(float(value))


def task_fields(t: NewTask, parent_id: int | None = None) -> list[str]:
    """A task's ``TASK_FIELDS`` arguments (``insert_task`` in ``lua/lib/enqueue.lua``),
    its parent ``parent_id`` if given, else its own."""
    parent = t.parent_id if parent_id is None else parent_id
    return [
        t.name,
        t.queue,
        t.payload,
        str(t.priority),
        opt(None if t.run_at is None else ms(t.run_at)),
        str(seconds_ms(t.delay)),
        str(t.max_attempts),
        retry_json(t.retry),
        opt(_seconds(t.timeout)),
        opt(_seconds(t.lease)),
        opt(t.step),
        "1" if t.inbox else "0",
        opt(parent),
        opt(t.message),
        opt(t.idempotency_key),
        opt(t.unique_scope),
        opt(None if t.unique_for is None else seconds_ms(t.unique_for)),
        t.on_conflict,
        opt(t.concurrency_key),
        opt(t.concurrency_limit),
        opt(t.rate_limit),
        opt(_seconds(t.rate_period)),
        opt(t.trace),
        opt(None if t.expires_at is None else ms(t.expires_at)),
        opt(" ".join(str(reference) for reference in t.after) if t.after else None),
        t.after_policy,
        opt(t.receives),
    ]


def tasks_arg(tasks: Sequence[NewTask]) -> str:
    """The tasks of ``enqueue.lua`` (and ``fire_schedule.lua``): every task's
    fields end to end, as one JSON array (one argument, which the script
    decodes in C: packing 27 arguments a task cost more than the script)."""
    fields: list[str] = []
    for t in tasks:
        fields += task_fields(t)
    return json.dumps(fields, ensure_ascii=False, separators=(",", ":"))


def finish_arg(completions: Sequence[Completion]) -> str:
    """The completions of ``finish.lua``, one JSON array each, as one JSON
    argument (decoded by the script in C: cheaper than one argument a field)."""
    rows: list[list[Any]] = []
    for c in completions:
        error = c.error
        rows.append(
            [
                str(c.token.task_id),
                c.token.attempt,
                c.next_state.value,
                c.outcome.value,
                c.result,
                error.type if error else None,
                error.message if error else None,
                error.traceback if error else None,
                None if c.retry_delay is None else seconds_ms(c.retry_delay),
                None if c.transition is None else _transition(c.transition),
                None if c.effects is None else _effects(c.token.task_id, c.effects),
                c.token.nonce,
            ]
        )
    return json.dumps(rows, ensure_ascii=False, separators=(",", ":"))


def _transition(move: Transition) -> list[str]:
    return [
        opt(move.step),
        move.state,
        str(move.max_attempts),
        retry_json(move.retry),
        opt(_seconds(move.timeout)),
        opt(_seconds(move.lease)),
        opt(None if move.run_at is None else ms(move.run_at)),
        str(seconds_ms(move.delay)),
    ]


def _effects(task_id: int, effects: Effects) -> list[Any]:
    """A poll's effects; its spawns are its children, its sends come from it.
    A spawn is stored pending: dependencies (``after``) are an enqueue's."""
    return [
        list(effects.consumed),
        [[str(d.task_id), d.body, opt(d.trace)] for d in effects.sends],
        [
            task_fields(replace(new, after=()) if new.after else new, parent_id=task_id)
            for new in effects.spawns
        ],
    ]


def send_args(deliveries: Sequence[Delivery]) -> list[str]:
    """The per-delivery arguments of ``send.lua``, in order."""
    args: list[str] = []
    for d in deliveries:
        args += [str(d.task_id), d.body, opt(d.sender_id), opt(d.idempotency_key), opt(d.trace)]
    return args


def claimed_tasks(
    found: Sequence[Sequence[str]], worker_id: str, nonce: str
) -> tuple[list[ClaimedTask], list[Unread]]:
    """The rows of ``claim.lua``, each: id, attempt, name, queue, payload,
    spent, max_attempts, retry policy, timeout, lease, lease expiry, step,
    parent id (optional ones as :func:`opt` writes them), run time ("" if
    it does not read), trace context (optional), the task's expiry time
    when this claim started its first attempt past it ("" otherwise), its
    ``receives`` (optional); every lease of the claim
    has its ``nonce``. Tasks of one claim mostly share a lease expiry: each
    distinct one is converted once.

    The script checked every number it hands out; a row that still does not
    read here (text that is not UTF-8) is set apart, alone, with why
    (:class:`~conveyor.backends.stored.Unread`): the rest of the claim runs."""
    expiries: dict[str, datetime] = {}
    return claimed_rows(
        found, lambda row: _claimed(row, worker_id, nonce, expiries), worker_id, nonce
    )


def utf8(text: str) -> bool:
    """Whether ``text`` was UTF-8 in the store: the client reads bytes that
    are not as lone surrogates (see :mod:`.connect`)."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


_CLAIMED_TEXTS = ((2, "name"), (3, "queue"), (4, "payload"), (7, "retry"), (11, "step"))


def _claimed(
    row: Sequence[str], worker_id: str, nonce: str, expiries: dict[str, datetime]
) -> ClaimedTask:
    task_id, attempt, name, queue, payload, spent, max_attempts, retry = row[:8]
    timeout, lease, expires, step, parent_id, run_at, trace = row[8:15]
    expired = row[15] if len(row) > 15 else ""
    receives = row[16] if len(row) > 16 else ""
    for position, field in _CLAIMED_TEXTS:
        if not utf8(row[position]):
            raise ValueError(f"task {task_id}'s field {field!r} is not UTF-8")
    if not utf8(receives):
        raise ValueError(f"task {task_id}'s field 'receives' is not UTF-8")
    if not utf8(trace):
        trace = ""  # a trace context that does not read starts a new trace
    budget = int(max_attempts)
    expires_at = expiries.get(expires)
    if expires_at is None:
        expires_at = expiries[expires] = moment(int(expires))
    return ClaimedTask(
        token=LeaseToken(int(task_id), int(attempt), worker_id, nonce),
        name=name,
        queue=queue,
        payload=payload,
        spent=int(spent),
        max_attempts=budget,
        retry=stored_retry_policy(retry, budget),
        timeout=_finite(timeout[1:]) if timeout else None,
        lease=_finite(lease[1:]) if lease else None,
        lease_expires_at=expires_at,
        step=step[1:] if step else None,
        parent_id=int(parent_id[1:]) if parent_id else None,
        run_at=moment(int(run_at)) if run_at.isdigit() else None,
        trace=trace[1:] if trace else None,
        expired_at=moment(int(expired)) if expired else None,
        receives=receives[1:] if receives else None,
    )


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"not a finite number: {text!r}")
    return value


CORRUPT = "corrupt"
"""The key of the payload a task that does not read is listed with."""


class _Fields:
    """A task's hash, read field by field. A field that does not read takes
    a neutral value (text "", number 0, the epoch, None) and is noted in
    ``unread``, so that one corrupt hash never fails a read of many."""

    def __init__(self, task_id: int, fields: Mapping[str, str]) -> None:
        self.task_id = task_id
        self.fields = fields
        self.unread: list[str] = []

    def _bad(self, name: str, why: str) -> None:
        self.unread.append(f"its field {name!r} {why}")

    def text(self, name: str) -> str:
        value = self.fields.get(name)
        if value is None:
            self._bad(name, "is missing")
            return ""
        return self._readable(name, value)

    def optional_text(self, name: str) -> str | None:
        value = self.fields.get(name)
        return None if value is None else self._readable(name, value)

    def _readable(self, name: str, value: str) -> str:
        """The text, its bytes that were not UTF-8 shown as U+FFFD."""
        if utf8(value):
            return value
        self._bad(name, "is not UTF-8")
        return value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")

    def integer(self, name: str, low: int = -(2**63), high: int = 2**63 - 1) -> int:
        text = self.fields.get(name)
        if text is None:
            self._bad(name, "is missing")
            return 0
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            self._bad(name, f"does not read: {text!r}")
            return 0
        return value

    def optional_integer(self, name: str) -> int | None:
        return self.integer(name) if name in self.fields else None

    def optional_seconds(self, name: str) -> float | None:
        if name not in self.fields:
            return None
        text = self.fields[name]
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value):
            self._bad(name, f"does not read: {text!r}")
            return None
        return value

    def moment(self, name: str) -> datetime:
        value = self.integer(name, _EARLIEST_MS, _LATEST_MS)
        return moment(value)

    def optional_moment(self, name: str) -> datetime | None:
        return self.moment(name) if name in self.fields else None

    def state(self) -> TaskState:
        text = self.text("state")
        try:
            return TaskState(text)
        except ValueError:
            if text:
                self._bad("state", f"is not a state: {text!r}")
            return TaskState.FAILED


_EARLIEST_MS = ms(datetime.min.replace(tzinfo=UTC))
_LATEST_MS = ms(datetime.max.replace(tzinfo=UTC))


def _progress(fields: Mapping[str, str]) -> Progress | None:
    """The task's progress report; None when it has none, or when either of
    its fields does not read (a corrupt report hides nothing else)."""
    text, at = fields.get("progress"), fields.get("progress_at")
    if text is None or at is None or not at.isdigit() or len(at) > 15:
        return None
    return progress_of(text, moment(int(at)))


def task(task_id: int, fields: Mapping[str, str], attempts: tuple[Attempt, ...]) -> Task:
    """The task stored in ``fields`` (its hash), with ``attempts``.

    A hash some of whose fields do not read (written around conveyor) is
    still a task, so that a listing goes on and the task can be found: each
    such field takes a neutral value (text "", number 0, the epoch, no
    state: ``failed``), and its payload is shown as ``{"corrupt": [why,
    ...], "payload": the stored payload}`` (as text when it does not decode).
    A claim that meets such a task sets it aside (it ends ``failed``, its
    attempt log saying why: ``CorruptTask``)."""
    f = _Fields(task_id, fields)
    max_attempts = f.integer("max_attempts", 1, 2**31 - 1) or 1
    result = f.optional_text("result")
    payload = codec.decode_for_display(f.text("payload"))
    listed = Task(
        id=task_id,
        name=f.text("name"),
        queue=f.text("queue"),
        payload=payload,
        state=f.state(),
        priority=f.integer("priority", -(2**31), 2**31 - 1),
        run_at=f.moment("run_at"),
        attempt=f.integer("attempt", 0),
        max_attempts=max_attempts,
        retry=stored_retry_policy(f.text("retry"), max_attempts),
        timeout=f.optional_seconds("timeout"),
        lease=f.optional_seconds("lease"),
        result=codec.decode_for_display(result) if result is not None else None,
        created_at=f.moment("created_at"),
        finished_at=f.optional_moment("finished_at"),
        worker_id=f.optional_text("worker_id"),
        lease_expires_at=f.optional_moment("lease_expires_at"),
        cancel_requested=fields.get("cancel_requested") == "1",
        attempts=attempts,
        step=f.optional_text("step"),
        parent_id=f.optional_integer("parent_id"),
        inbox=fields.get("inbox") == "1",
        idempotency_key=f.optional_text("idempotency_key"),
        concurrency_key=f.optional_text("concurrency_key"),
        waiting_for=f.integer("waiting_for", 0, 2**31 - 2) if "waiting_for" in fields else None,
        progress=_progress(fields),
    )
    if not f.unread:
        return listed
    return replace(listed, payload={CORRUPT: f.unread, "payload": payload})


def summary(task_id: int, fields: Mapping[str, str], last_attempt: str | None) -> TaskSummary:
    """The summary of the task whose hash holds ``fields`` (its
    ``SUMMARY_FIELDS`` at least), with the last row of its attempt log
    (None: none was read). A field that does not read takes the neutral
    value :func:`task` gives it; an attempt row that does not read gives no
    ``last_error``."""
    f = _Fields(task_id, fields)
    state = f.state()
    last = None
    if last_attempt is not None:
        try:
            last = attempt(task_id, last_attempt)
        except BackendError:
            last = None
    return TaskSummary(
        id=task_id,
        name=f.text("name"),
        queue=f.text("queue"),
        state=state,
        priority=f.integer("priority", -(2**31), 2**31 - 1),
        run_at=f.moment("run_at"),
        attempt=f.integer("attempt", 0),
        max_attempts=f.integer("max_attempts", 1, 2**31 - 1) or 1,
        created_at=f.moment("created_at"),
        finished_at=f.optional_moment("finished_at"),
        worker_id=f.optional_text("worker_id") if state is TaskState.IN_PROGRESS else None,
        cancel_requested=fields.get("cancel_requested") == "1",
        step=f.optional_text("step"),
        last_error=last_error_of(
            state,
            None if last is None else last.outcome.value,
            None if last is None else last.error_type,
            None if last is None else last.error_message,
        ),
    )


def attempts(task_id: int, fields: Mapping[str, str], log: Sequence[str]) -> tuple[Attempt, ...]:
    """A task's attempts: the rows of its log (``{p}:attempts:ID``, the ended
    ones), then the running one, which lives in its hash (``attempt``,
    ``worker_id``, ``started_at``, ``step``) while it is in progress (left
    out when those do not read: :func:`task` says so)."""
    ended = [attempt(task_id, text) for text in log]
    if fields.get("state") != TaskState.IN_PROGRESS.value:
        return tuple(ended)
    f = _Fields(task_id, fields)
    running = Attempt(
        task_id=task_id,
        number=f.integer("attempt", 0),
        worker_id=f.text("worker_id"),
        outcome=Outcome.IN_PROGRESS,
        started_at=f.moment("started_at"),
        finished_at=None,
        step=f.optional_text("step"),
    )
    if f.unread:
        return tuple(ended)
    return (*ended, running)


def edge(row: Sequence[str]) -> DependencyEdge:
    """One edge as ``edges.lua`` returns it: the dependent's id, the
    position, the dependency's id, ``1`` when settled."""
    return DependencyEdge(int(row[0]), int(row[1]), int(row[2]), row[3] == "1")


def dependency(row: Sequence[str]) -> DependencyRecord:
    """One edge as ``dependencies.lua`` returns it: the dependency's id,
    ``1`` when settled, then (a dependency still stored) its name, state,
    result and the last row of its attempt log, each optional. A state
    that does not read is taken as ``failed`` (as :func:`task` lists it);
    an attempt row that does not read gives no error."""
    task_id, settled = int(row[0]), row[1] == "1"
    if len(row) < 6:
        return dependency_record(task_id, settled)
    name, state, result, last = (text[1:] if text else None for text in row[2:6])
    if state not in _STATE_VALUES:
        state = TaskState.FAILED.value
    ended = None
    if last is not None:
        try:
            ended = attempt(task_id, last)
        except BackendError:
            ended = None
    return dependency_record(
        task_id,
        settled,
        name,
        state,
        result,
        None if ended is None else ended.outcome.value,
        None if ended is None else ended.error_type,
        None if ended is None else ended.error_message,
    )


_STATE_VALUES = frozenset(s.value for s in TaskState)


def attempt(task_id: int, text: str) -> Attempt:
    """One row of a task's attempt log."""
    try:
        row: dict[str, Any] = json.loads(text)
        finished = row.get("finished_at")
        return Attempt(
            task_id=task_id,
            number=int(row["number"]),
            worker_id=str(row["worker_id"]),
            outcome=Outcome(row["outcome"]),
            started_at=moment(int(row["started_at"])),
            finished_at=None if finished is None else moment(int(finished)),
            error_type=row.get("error_type"),
            error_message=row.get("error_message"),
            traceback=row.get("traceback"),
            step=row.get("step"),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise BackendError(
            f"task {task_id} is corrupt in Redis: an attempt row does not read ({exc}): {text!r}"
        ) from None


def message(task_id: int, text: str) -> Message:
    """One member of a task's inbox: the JSON array ``[id, sender id or "",
    kind, created_at (ms), body (JSON text)]``, and the sender's trace context
    when it has one. One that does not read (written around conveyor) raises
    BackendError naming the task."""
    try:
        message_id, sender, kind, created_at, body, *traced = json.loads(text)
        trace = traced[0] if len(traced) == 1 and isinstance(traced[0], str) else None
        return Message(
            id=int(message_id),
            task_id=task_id,
            sender_id=int(sender) if sender != "" else None,
            kind=MessageKind(kind),
            body=codec.decode(body),
            created_at=moment(int(created_at)),
            trace=trace,
        )
    except (ValueError, TypeError) as exc:
        raise BackendError(
            f"task {task_id} is corrupt in Redis: a message of its inbox does not read "
            f"({exc}): {text!r}"
        ) from None


def prune_args(params: PruneParams) -> list[str | int]:
    """The arguments of ``prune.lua``: the limit, the workers' cutoff, then
    each state and its cutoff (``count_prunable.lua`` takes all but the limit)."""
    args: list[str | int] = [
        params.limit,
        opt(None if params.workers_before is None else ms(params.workers_before)),
    ]
    for state, before in params.before.items():
        args += [state.value, ms(before)]
    return args


def pause(field: str, paused_at: str) -> Pause:
    """A field of the pauses hash (``KIND:NAME``) and its time; one that
    does not read raises BackendError."""
    kind, _, name = field.partition(":")
    try:
        return Pause(PauseKind(kind), name, moment(int(paused_at)))
    except ValueError:
        raise BackendError(f"a pause is corrupt in Redis: {field!r} = {paused_at!r}") from None


def worker_args(info: WorkerInfo) -> list[str]:
    """The arguments of ``register_worker.lua`` after ``now``."""
    return [
        info.id,
        info.host,
        str(info.pid),
        json.dumps(list(info.queues)),
        str(info.concurrency),
        json.dumps(list(info.tasks)),
        opt(_seconds(info.beat_seconds)),
    ]


def worker(worker_id: str, fields: Mapping[str, str]) -> WorkerInfo:
    """A worker's hash; one that does not read raises BackendError."""
    try:
        stopped = fields.get("stopped_at")
        beat = fields.get("beat_seconds")
        return WorkerInfo(
            id=worker_id,
            host=fields["host"],
            pid=int(fields["pid"]),
            queues=tuple(json.loads(fields["queues"])),
            concurrency=int(fields["concurrency"]),
            started_at=moment(int(fields["started_at"])),
            last_seen_at=moment(int(fields["last_seen_at"])),
            stopped_at=None if stopped is None else moment(int(stopped)),
            tasks=tuple(json.loads(fields["tasks"])),
            beat_seconds=None if beat is None else float(beat),
        )
    except (KeyError, ValueError, TypeError) as exc:
        raise BackendError(
            f"worker {worker_id!r} is corrupt in Redis: its fields do not read ({exc!r})"
        ) from None
