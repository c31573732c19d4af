"""Check a chaos run's history offline: nothing lost, nothing run twice unexplained.

Pure: :func:`check` reads only what it is given (the tasks with their attempt
log, the effects ledger the handlers wrote, the harness's fault events) and
returns a :class:`Report`. :func:`read_ledger` and :func:`read_events` parse
JSON lines the caller has read.

What a :class:`Report` guarantees when ``ok``:

* ``lost``: every acknowledged task exists and is terminal.
* ``double_success``: at most one attempt of a plain task succeeded, and it
  is the last attempt; in a step workflow or coroutine, at most one attempt
  committed each step or poll (its ``seq``).
* ``step_rerun``: no step or poll ran again (in a later attempt) after an
  attempt committed its transition.
* ``attempt_numbers``: attempts are numbered exactly 1..n; at most one is
  ``in_progress``, it is the last one, and only on a task that is not terminal.
* ``stale_write_accepted``: no success was recorded for an execution whose
  lease had already moved on (its ledger ``end`` or its recorded finish came
  after the next attempt started), and no task is ``succeeded`` without a
  succeeded last attempt.
* ``overlapping_leases``: two executions of one task overlap in time only
  when the earlier attempt ended ``lease_lost`` (the expected zombie, counted
  in ``duplicates_explained``).
* ``unexplained_duplicate``: every execution has its own attempt row (no
  attempt number run twice, none run without a row), and no attempt follows a
  ``cancelled`` one. A later attempt is expected after ``lease_lost``,
  ``interrupted``, ``timed_out`` and ``failed`` (a retry); one after a
  succeeded attempt is reported as ``double_success`` or
  ``stale_write_accepted``, one after an ``in_progress`` attempt as
  ``attempt_numbers``.
* ``control_duplicate``: in a fault-free run, no plain task has more than
  one attempt or execution, and every attempt of a workflow or coroutine ran
  once and committed.
* ``wrong_result``, ``message_lost``, ``message_twice``: a succeeded task's
  result is what ``expected`` says (see :class:`Expected`): for a coroutine
  that collects its messages, each message exactly once.
* ``chord``: each chord's callback ended ``succeeded`` by exactly one
  succeeded attempt, its result is its members' results in order (none
  missed, none counted twice), and every member ended ``succeeded``.
* ``early_callback``: by the ledger, each chord's callback first started
  after every member's last execution ended, and no member started again
  after that (executions under an attempt that lost its lease to a later
  attempt are not counted: the store refused their completion).
* ``slow_reclaim``: a task held by a worker that was killed (or stopped for
  longer than its lease) got its next attempt within
  ``lease + poll_interval + reclaim_slack`` seconds of the fault. On a
  single-writer store (SQLite) a stopped process may hold the write lock and
  freeze every worker until it continues; its stop then counts from its
  continue minus a lease.

Limits: times compare the workers' and harness's wall clock (ledger, faults)
with the backend's clock (attempt rows); both must be this machine's, and a
late write within the store clock's resolution (1 ms) is not told apart. Only
tasks present in ``tasks`` are checked beyond ``lost``; ledger lines of other
tasks are ignored. A workflow's or coroutine's ledger lines must carry
``seq`` (transitions committed before the execution began); a plain task's
is 0. An execution without an ``end`` is taken to last until its process was
killed, else until its attempt finished, else forever.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import json
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, cast

from conveyor.model import Attempt, Outcome, Task, TaskState

LedgerEvent = Literal["start", "end"]
FaultKind = Literal["kill", "stop", "cont", "spawn", "term", "hung"]
LEDGER_EVENTS: frozenset[str] = frozenset({"start", "end"})
FAULT_EVENTS: frozenset[str] = frozenset({"kill", "stop", "cont", "spawn", "term", "hung", "exit"})
# A later attempt is expected after these outcomes (a reclaim or a retry).
RETRYABLE = frozenset({Outcome.LEASE_LOST, Outcome.INTERRUPTED, Outcome.TIMED_OUT, Outcome.FAILED})
DEFAULT_RECLAIM_SLACK = 1.0
SUMMARY_VIOLATIONS = 15


class HistoryError(ValueError):
    """A ledger or fault line that is not a well-formed record (and not a torn last line)."""


STORE_CLOCK_RESOLUTION = 0.001
"""Seconds the store's clock may lag the workers': SQLite's ``julianday('now')``
keeps milliseconds."""


class Kind(enum.StrEnum):
    """The kinds of violation :func:`check` reports."""

    LOST = "lost"
    DOUBLE_SUCCESS = "double_success"
    ATTEMPT_NUMBERS = "attempt_numbers"
    STALE_WRITE_ACCEPTED = "stale_write_accepted"
    OVERLAPPING_LEASES = "overlapping_leases"
    UNEXPLAINED_DUPLICATE = "unexplained_duplicate"
    CONTROL_DUPLICATE = "control_duplicate"
    SLOW_RECLAIM = "slow_reclaim"
    STEP_RERUN = "step_rerun"
    WRONG_RESULT = "wrong_result"
    MESSAGE_LOST = "message_lost"
    MESSAGE_TWICE = "message_twice"
    HUNG_WORKER = "hung_worker"
    """A worker that did not exit within its bound after SIGTERM (the
    harness then killed it)."""
    SCHEDULE_SLOT = "schedule_slot"
    """A schedule's slot fired twice, or missed between two that fired."""
    UNIQUE_KEY = "unique_key"
    """A unique key of the race held by two tasks, or a racer answered with
    another task than the one stored for its key (or failing)."""
    EARLY_CALLBACK = "early_callback"
    """A chord's callback started before one of its members' last execution
    ended, or a member started again after its callback started."""
    CHORD = "chord"
    """A chord's callback that did not end succeeded by exactly one attempt,
    or whose result is not its members' results in order, or a member of a
    chord that did not end succeeded."""


@dataclass(frozen=True, slots=True)
class Execution:
    """One ledger line: a handler began (``start``) or finished its body (``end``)."""

    event: LedgerEvent
    task: int
    attempt: int
    worker: str
    pid: int
    at: float
    """``time.time()`` when the line was written."""
    seq: int = 0
    """Transitions of the task committed when the execution began (0: a plain task)."""


@dataclass(frozen=True, slots=True)
class Expected:
    """What a succeeded task's result must be.

    With ``messages`` None the result must equal ``result``. Otherwise the
    result is a list of message bodies (strings): each of ``messages`` must
    appear exactly as often as it is listed there, plus at most once more for
    each time it is listed in ``maybe`` (a send whose outcome the sender does
    not know); nothing else may appear.
    """

    result: Any = None
    messages: tuple[str, ...] | None = None
    maybe: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class FaultEvent:
    """One harness line: a worker process was spawned or sent a signal."""

    event: FaultKind
    pid: int
    at: float


@dataclass(frozen=True, slots=True)
class Violation:
    kind: Kind
    task_id: int | None
    detail: str

    def to_json(self) -> dict[str, Any]:
        return {"kind": str(self.kind), "task_id": self.task_id, "detail": self.detail}

    def __str__(self) -> str:
        where = f"task {self.task_id}" if self.task_id is not None else "run"
        return f"{self.kind} [{where}]: {self.detail}"


@dataclass(frozen=True, slots=True)
class NameCounts:
    """The checked tasks of one name: how many, their attempts, the attempts
    that ended ``lease_lost``, and where SIGKILL caught their executions."""

    tasks: int = 0
    attempts: int = 0
    lease_lost: int = 0
    killed_in_body: int = 0
    """Executions whose process was killed before their body ended."""
    killed_before_commit: int = 0
    """Executions whose body ended (its side effects done) but whose process
    was killed before their completion was recorded (their attempt ``lease_lost``)."""

    def add(self, h: _History, kills: Mapping[int, list[float]]) -> NameCounts:
        lost = sum(a.outcome is Outcome.LEASE_LOST for a in h.attempts)
        in_body = before_commit = 0
        for run in h.runs:
            killed = [t for t in kills.get(run.pid, []) if t >= run.start]
            if not killed:
                continue
            attempt = h.attempt(run.attempt)
            if run.end is None or run.end > killed[0]:
                in_body += 1
            elif attempt is not None and attempt.outcome is Outcome.LEASE_LOST:
                before_commit += 1
        return NameCounts(
            self.tasks + 1,
            self.attempts + len(h.attempts),
            self.lease_lost + lost,
            self.killed_in_body + in_body,
            self.killed_before_commit + before_commit,
        )

    def to_json(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        text = f"{self.tasks} tasks, {self.attempts} attempts, {self.lease_lost} lease lost"
        if self.killed_in_body or self.killed_before_commit:
            text += (
                f"; killed {self.killed_in_body} in the body, "
                f"{self.killed_before_commit} after it and before the commit"
            )
        return text


@dataclass(frozen=True, slots=True)
class Report:
    """What :func:`check` found: counts, and every violation."""

    enqueued: int
    terminal: int
    succeeded: int
    failed: int
    cancelled: int
    lost: int
    duplicates: int
    """Tasks with a step (a plain task's only one) executed more than once."""
    duplicates_explained: int
    """Tasks whose executions overlapped, each time with a ``lease_lost`` predecessor."""
    stale_writes_rejected: int
    """Executions that reached their ``end`` but whose attempt ended ``lease_lost``."""
    stale_writes_accepted: int
    handlers_stopped: int
    """Executions under a lost lease that never reached their ``end`` though
    their process was not killed: the worker stopped the handler."""
    worst_reclaim_seconds: float | None
    reclaims: int
    """Attempts held by a dead worker whose reclaim latency was measured."""
    worker_restarts: int
    violations: tuple[Violation, ...] = field(default=())
    names: Mapping[str, NameCounts] = field(default_factory=dict)
    """Every checked task (children too) by name."""

    @property
    def ok(self) -> bool:
        return not self.violations

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "enqueued": self.enqueued,
            "terminal": self.terminal,
            "succeeded": self.succeeded,
            "failed": self.failed,
            "cancelled": self.cancelled,
            "lost": self.lost,
            "duplicates": self.duplicates,
            "duplicates_explained": self.duplicates_explained,
            "stale_writes_rejected": self.stale_writes_rejected,
            "stale_writes_accepted": self.stale_writes_accepted,
            "handlers_stopped": self.handlers_stopped,
            "worst_reclaim_seconds": self.worst_reclaim_seconds,
            "reclaims": self.reclaims,
            "worker_restarts": self.worker_restarts,
            "names": {name: c.to_json() for name, c in sorted(self.names.items())},
            "violations": [v.to_json() for v in self.violations],
        }

    def summary(self) -> str:
        """A short text report, one screen at most."""
        worst = self.worst_reclaim_seconds
        lines = [
            f"chaos check: {'OK' if self.ok else f'FAILED ({len(self.violations)} violations)'}",
            f"tasks: {self.enqueued} enqueued, {self.terminal} terminal "
            f"({self.succeeded} succeeded, {self.failed} failed, {self.cancelled} cancelled), "
            f"{self.lost} lost",
            f"duplicates: {self.duplicates} tasks run more than once, "
            f"{self.duplicates_explained} overlapping a lost lease",
            f"stale writes: {self.stale_writes_rejected} rejected, "
            f"{self.stale_writes_accepted} accepted; "
            f"{self.handlers_stopped} handlers stopped after losing their lease",
            f"reclaims: {self.reclaims}, worst "
            f"{'n/a' if worst is None else f'{worst:.2f}s'}; "
            f"worker restarts: {self.worker_restarts}",
        ]
        lines += [f"  {name}: {c}" for name, c in sorted(self.names.items())]
        lines += [f"  {v}" for v in self.violations[:SUMMARY_VIOLATIONS]]
        if len(self.violations) > SUMMARY_VIOLATIONS:
            lines.append(f"  ... and {len(self.violations) - SUMMARY_VIOLATIONS} more")
        return "\n".join(lines)


# -- reading ---------------------------------------------------------------


def read_ledger(lines: Iterable[str]) -> list[Execution]:
    """Parse effects-ledger JSON lines; skip blank lines and a torn last line.

    Read each file on its own: a torn line is tolerated only at the very end.
    Raises :class:`HistoryError` on any other malformed line.
    """
    return [_execution(n, data) for n, data in _records(lines)]


def read_events(lines: Iterable[str]) -> list[FaultEvent]:
    """Parse the harness's fault JSON lines, like :func:`read_ledger`."""
    return [_fault(n, data) for n, data in _records(lines)]


read_faults = read_events


def _records(lines: Iterable[str]) -> list[tuple[int, dict[str, Any]]]:
    rows = [(n, text) for n, line in enumerate(lines, 1) if (text := line.strip())]
    records = []
    for i, (n, text) in enumerate(rows):
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            if i == len(rows) - 1:
                break  # the writer was killed mid-line
            raise HistoryError(f"line {n}: not JSON: {text[:80]!r}") from None
        if not isinstance(data, dict):
            raise HistoryError(f"line {n}: not a JSON object: {text[:80]!r}")
        records.append((n, data))
    return records


def _bad(n: int, data: Mapping[str, Any], name: str) -> HistoryError:
    return HistoryError(f"line {n}: bad or missing {name!r}: {data!r}")


def _int(n: int, data: Mapping[str, Any], name: str) -> int:
    value = data.get(name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(n, data, name)
    return value


def _float(n: int, data: Mapping[str, Any], name: str) -> float:
    value = data.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _bad(n, data, name)
    return float(value)


def _str(n: int, data: Mapping[str, Any], name: str) -> str:
    value = data.get(name)
    if not isinstance(value, str):
        raise _bad(n, data, name)
    return value


def _event(n: int, data: Mapping[str, Any], allowed: frozenset[str]) -> str:
    event = data.get("event")
    if event not in allowed:
        raise HistoryError(f"line {n}: event must be one of {sorted(allowed)}: {data!r}")
    return cast(str, event)


def _execution(n: int, data: Mapping[str, Any]) -> Execution:
    return Execution(
        event=cast(LedgerEvent, _event(n, data, LEDGER_EVENTS)),
        task=_int(n, data, "task"),
        attempt=_int(n, data, "attempt"),
        worker=_str(n, data, "worker"),
        pid=_int(n, data, "pid"),
        at=_float(n, data, "at"),
        seq=_int(n, data, "seq") if "seq" in data else 0,
    )


def _fault(n: int, data: Mapping[str, Any]) -> FaultEvent:
    return FaultEvent(
        event=cast(FaultKind, _event(n, data, FAULT_EVENTS)),
        pid=_int(n, data, "pid"),
        at=_float(n, data, "at"),
    )


# -- executions --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Run:
    """One execution: a ledger ``start`` and its ``end`` (None if it never ended)."""

    task: int
    attempt: int
    worker: str
    pid: int
    start: float
    end: float | None
    seq: int = 0


def _pair(ledger: Iterable[Execution]) -> list[_Run]:
    """Match each ``start`` with the first later ``end`` of the same execution."""
    starts: dict[tuple[int, int, str, int], list[tuple[float, int]]] = defaultdict(list)
    ends: dict[tuple[int, int, str, int], list[float]] = defaultdict(list)
    for e in ledger:
        key = (e.task, e.attempt, e.worker, e.pid)
        if e.event == "start":
            starts[key].append((e.at, e.seq))
        else:
            ends[key].append(e.at)
    runs = []
    for key, begun in starts.items():
        pending = sorted(ends.get(key, []))
        for at, seq in sorted(begun):
            end = next((t for t in pending if t >= at), None)
            if end is not None:
                pending.remove(end)
            runs.append(_Run(*key, start=at, end=end, seq=seq))
    return sorted(runs, key=lambda r: (r.task, r.start))


def _started(attempt: Attempt) -> float:
    return attempt.started_at.timestamp()


def _finished(attempt: Attempt) -> float | None:
    return None if attempt.finished_at is None else attempt.finished_at.timestamp()


@dataclass(frozen=True, slots=True)
class _History:
    """One task as the checks see it: attempts by number, and its executions."""

    task: Task
    attempts: tuple[Attempt, ...]
    runs: tuple[_Run, ...]

    def attempt(self, number: int) -> Attempt | None:
        return next((a for a in self.attempts if a.number == number), None)

    def after(self, attempt: Attempt) -> Attempt | None:
        """The attempt that follows ``attempt``."""
        later = [a for a in self.attempts if a.number > attempt.number]
        return later[0] if later else None

    def runs_of(self, number: int) -> list[_Run]:
        return [r for r in self.runs if r.attempt == number]

    @property
    def steps(self) -> bool:
        """A step workflow or coroutine: each attempt runs one step or poll."""
        return self.task.step is not None or self.task.inbox

    @property
    def duplicated(self) -> bool:
        """Some step (a plain task's only one) executed more than once."""
        return any(n > 1 for n in Counter(r.seq for r in self.runs).values())


def _v(kind: Kind, task: Task, detail: str) -> Violation:
    return Violation(kind, task.id, detail)


# -- the checks --------------------------------------------------------------


def _check_lost(tasks: Mapping[int, Task], enqueued: Sequence[int]) -> list[Violation]:
    found = []
    for task_id in enqueued:
        task = tasks.get(task_id)
        if task is None:
            found.append(Violation(Kind.LOST, task_id, "acknowledged but missing from the store"))
        elif not task.state.is_terminal:
            detail = f"acknowledged, still {task.state} after attempt {task.attempt}"
            found.append(Violation(Kind.LOST, task_id, detail))
    return found


def _check_schedule(ticks: Sequence[Task], seconds: float) -> list[Violation]:
    """Each slot (the key ``schedule:NAME:SLOT``) enqueued once, and every slot
    between the first and the last enqueued (the schedule fires all missed
    slots)."""
    slots: dict[datetime, list[int]] = defaultdict(list)
    for task in ticks:
        key = task.idempotency_key or ""
        stamp = key.split(":", 2)[-1].removesuffix("Z")
        try:
            slots[datetime.fromisoformat(stamp)].append(task.id)
        except ValueError:
            return [_v(Kind.SCHEDULE_SLOT, task, f"not a schedule's key: {key!r}")]
    found = [
        Violation(Kind.SCHEDULE_SLOT, ids[1], f"slot {slot} fired by tasks {ids}")
        for slot, ids in sorted(slots.items())
        if len(ids) > 1
    ]
    ordered = sorted(slots)
    for earlier, later in itertools.pairwise(ordered):
        gap = (later - earlier).total_seconds()
        if abs(gap - seconds) > 1e-6:
            detail = f"{gap:.0f}s from slot {earlier} to {later}: slots missing"
            found.append(Violation(Kind.SCHEDULE_SLOT, slots[later][0], detail))
    return found


def _check_unique(
    races: Sequence[Task], answers: Sequence[Mapping[int, int] | None], keys: int
) -> list[Violation]:
    """One stored task per key of the race (its payload's ``k``), and every
    racer answered, for each key, with that task."""
    stored: dict[int, list[int]] = defaultdict(list)
    for task in races:
        stored[int(task.payload["k"])].append(task.id)
    found = [
        Violation(Kind.UNIQUE_KEY, ids[1], f"key race:{k} is held by tasks {sorted(ids)}")
        for k, ids in sorted(stored.items())
        if len(ids) > 1
    ]
    for n, answered in enumerate(answers):
        if answered is None:
            found.append(Violation(Kind.UNIQUE_KEY, None, f"racer {n} failed (race-{n}.log)"))
            continue
        for k in range(keys):
            got, ids = answered.get(k), stored.get(k, [])
            if got is None or got not in ids:
                detail = f"racer {n} was answered {got} for race:{k}; stored: {ids}"
                found.append(Violation(Kind.UNIQUE_KEY, got, detail))
    return found


def _check_success(h: _History) -> list[Violation]:
    """``double_success``, ``step_rerun`` and ``stale_write_accepted``."""
    task = h.task
    succeeded = [a for a in h.attempts if a.outcome is Outcome.SUCCEEDED]
    late = _check_late(h, succeeded) + _check_terminal_write(h)
    if h.steps:
        return _check_commits(h, succeeded) + late
    found = []
    if len(succeeded) > 1:
        numbers = ", ".join(str(a.number) for a in succeeded)
        found.append(_v(Kind.DOUBLE_SUCCESS, task, f"attempts {numbers} all succeeded"))
    elif (
        succeeded
        and (following := h.after(succeeded[0])) is not None
        and _late_write(h, succeeded[0], following) is None  # a late one is reported above
    ):
        detail = f"attempt {succeeded[0].number} succeeded, then attempt {following.number} ran"
        found.append(_v(Kind.DOUBLE_SUCCESS, task, detail))
    return found + late


def _check_commits(h: _History, succeeded: Sequence[Attempt]) -> list[Violation]:
    """Each step or poll (``seq``) committed by one attempt, and never run after it."""
    found = []
    committed: dict[int, Attempt] = {}
    for attempt in succeeded:
        for seq in sorted({r.seq for r in h.runs_of(attempt.number)}):
            first = committed.setdefault(seq, attempt)
            if first is not attempt:
                detail = f"attempts {first.number} and {attempt.number} both committed step {seq}"
                found.append(_v(Kind.DOUBLE_SUCCESS, h.task, detail))
    for run in h.runs:
        committer = committed.get(run.seq)
        if committer is not None and run.attempt > committer.number:
            detail = (
                f"step {run.seq} ran again in attempt {run.attempt} "
                f"after attempt {committer.number} committed it"
            )
            found.append(_v(Kind.STEP_RERUN, h.task, detail))
    return found


def _check_late(h: _History, succeeded: Sequence[Attempt]) -> list[Violation]:
    """A success written after the next attempt had begun."""
    found = []
    for attempt in succeeded:
        following = h.after(attempt)
        late = None if following is None else _late_write(h, attempt, following)
        if late:
            found.append(_v(Kind.STALE_WRITE_ACCEPTED, h.task, late))
    return found


def _check_terminal_write(h: _History) -> list[Violation]:
    """A task marked succeeded by a write its last attempt did not make."""
    if h.task.state is not TaskState.SUCCEEDED:
        return []
    last = h.attempts[-1] if h.attempts else None
    if last is None:
        detail = "task succeeded without any attempt"
    elif last.outcome is not Outcome.SUCCEEDED:
        detail = f"task succeeded, but its last attempt {last.number} ended {last.outcome}"
    else:
        return []
    return [_v(Kind.STALE_WRITE_ACCEPTED, h.task, detail)]


def _late_write(h: _History, attempt: Attempt, following: Attempt) -> str | None:
    """Why the success of ``attempt`` was written after its lease moved on, if it was.

    The next attempt's start is the store's clock, which may run up to
    ``STORE_CLOCK_RESOLUTION`` behind the ledger's (SQLite keeps
    milliseconds): a handler's end within that of the next start is not
    evidence of a late write. Two times of the store compare exactly."""
    moved_on = _started(following)
    ends = [r.end for r in h.runs_of(attempt.number) if r.end is not None]
    if ends and max(ends) > moved_on + STORE_CLOCK_RESOLUTION:
        return (
            f"attempt {attempt.number} succeeded; its handler ended "
            f"{max(ends) - moved_on:.3f}s "
            f"after attempt {following.number} started"
        )
    finished = _finished(attempt)
    if finished is not None and finished > moved_on:
        return (
            f"attempt {attempt.number} succeeded; recorded {finished - moved_on:.3f}s "
            f"after attempt {following.number} started"
        )
    return None


def _check_attempt_numbers(h: _History) -> list[Violation]:
    task = h.task
    found = []
    numbers = [a.number for a in h.attempts]
    if numbers != list(range(1, len(numbers) + 1)):
        found.append(_v(Kind.ATTEMPT_NUMBERS, task, f"attempt numbers are {numbers}"))
    running = [a.number for a in h.attempts if a.outcome is Outcome.IN_PROGRESS]
    if len(running) > 1:
        found.append(_v(Kind.ATTEMPT_NUMBERS, task, f"attempts {running} all in_progress"))
    elif running and running[0] != numbers[-1]:
        detail = f"attempt {running[0]} still in_progress, but attempt {numbers[-1]} followed"
        found.append(_v(Kind.ATTEMPT_NUMBERS, task, detail))
    if running and task.state.is_terminal:
        detail = f"task {task.state}, but attempt {running[-1]} is in_progress"
        found.append(_v(Kind.ATTEMPT_NUMBERS, task, detail))
    return found


def _check_executions(h: _History) -> list[Violation]:
    """``unexplained_duplicate``: executions without an attempt of their own."""
    task = h.task
    found = []
    known = {a.number for a in h.attempts}
    for number, count in sorted(Counter(r.attempt for r in h.runs).items()):
        if count > 1:
            detail = f"attempt {number} executed {count} times"
            found.append(_v(Kind.UNEXPLAINED_DUPLICATE, task, detail))
        if number not in known:
            detail = f"attempt {number} executed, but there is no such attempt"
            found.append(_v(Kind.UNEXPLAINED_DUPLICATE, task, detail))
    if not found and len(h.runs) > len(h.attempts):
        detail = f"executed {len(h.runs)} times in {len(h.attempts)} attempts"
        found.append(_v(Kind.UNEXPLAINED_DUPLICATE, task, detail))
    for previous, attempt in zip(h.attempts, h.attempts[1:], strict=False):
        if previous.outcome is Outcome.CANCELLED:
            detail = f"attempt {attempt.number} ran after attempt {previous.number} was cancelled"
            found.append(_v(Kind.UNEXPLAINED_DUPLICATE, task, detail))
    return found


def _until(run: _Run, attempt: Attempt | None, kills: Mapping[int, list[float]]) -> float:
    """When an execution stopped: its end, else its process's kill, else its
    attempt's finish, else never."""
    if run.end is not None:
        return run.end
    killed = [t for t in kills.get(run.pid, []) if t >= run.start]
    if killed:
        return killed[0]
    finished = None if attempt is None else _finished(attempt)
    return math.inf if finished is None else finished


def _check_overlaps(h: _History, kills: Mapping[int, list[float]]) -> tuple[list[Violation], bool]:
    """``overlapping_leases``, and whether an overlap after a lost lease was seen."""
    spans = [(r, _until(r, h.attempt(r.attempt), kills)) for r in h.runs]
    found, explained = [], False
    for i, (one, one_until) in enumerate(spans):
        for other, other_until in spans[i + 1 :]:
            if one.attempt == other.attempt:
                continue  # reported as an attempt executed twice
            if not (other.start < one_until and one.start < other_until):
                continue
            first, second = sorted((one, other), key=lambda r: r.attempt)
            predecessor = h.attempt(first.attempt)
            if predecessor is None:
                continue  # reported as an execution without an attempt
            if predecessor.outcome is Outcome.LEASE_LOST:
                explained = True
                continue
            detail = (
                f"attempt {second.attempt} ran while attempt "
                f"{first.attempt} ({predecessor.outcome}) was still running"
            )
            found.append(_v(Kind.OVERLAPPING_LEASES, h.task, detail))
    return found, explained


def _check_control(h: _History) -> list[Violation]:
    if h.steps:
        uncommitted = [a.number for a in h.attempts if a.outcome is not Outcome.SUCCEEDED]
        if uncommitted or len(h.runs) > len(h.attempts):
            detail = (
                f"{len(h.runs)} executions in {len(h.attempts)} attempts, attempts "
                f"{uncommitted} not committed, in a fault-free run"
            )
            return [_v(Kind.CONTROL_DUPLICATE, h.task, detail)]
        return []
    if len(h.attempts) > 1 or len(h.runs) > 1:
        detail = f"{len(h.attempts)} attempts, {len(h.runs)} executions in a fault-free run"
        return [_v(Kind.CONTROL_DUPLICATE, h.task, detail)]
    return []


def _check_result(task: Task, expected: Expected) -> list[Violation]:
    """``wrong_result``, ``message_lost`` and ``message_twice`` for a succeeded task."""
    if task.state is not TaskState.SUCCEEDED:
        return []
    if expected.messages is None:
        if task.result == expected.result:
            return []
        detail = f"result {task.result!r}, expected {expected.result!r}"
        return [_v(Kind.WRONG_RESULT, task, detail)]
    if not isinstance(task.result, list):
        return [_v(Kind.WRONG_RESULT, task, f"result {task.result!r} is not a list of messages")]
    got: Counter[Any] = Counter(
        item if isinstance(item, str) else json.dumps(item) for item in task.result
    )
    need, maybe = Counter(expected.messages), Counter(expected.maybe)
    found = []
    for item in sorted(set(need) | set(maybe) | set(got)):
        if got[item] < need[item]:
            detail = f"message {item!r} consumed {got[item]} times, sent {need[item]}"
            found.append(_v(Kind.MESSAGE_LOST, task, detail))
        elif got[item] > need[item] + maybe[item]:
            if need[item] + maybe[item] == 0:
                found.append(_v(Kind.WRONG_RESULT, task, f"unexpected message {item!r}"))
            else:
                detail = (
                    f"message {item!r} consumed {got[item]} times, sent {need[item]} "
                    f"(+{maybe[item]} unknown)"
                )
                found.append(_v(Kind.MESSAGE_TWICE, task, detail))
    return found


# -- reclaim latency -----------------------------------------------------------


def _deaths(
    faults: Sequence[FaultEvent], lease: float, single_writer: bool = False
) -> dict[int, list[float]]:
    """pid -> times it died: killed, or stopped and not continued within ``lease``.

    With ``single_writer`` (SQLite), a process stopped while it held the
    store's write lock froze every writer until it continued: its death then
    counts from its continue minus a lease, the latest moment a continue
    could have come and still been in time."""
    by_pid: dict[int, list[FaultEvent]] = defaultdict(list)
    for f in sorted(faults, key=lambda f: f.at):
        by_pid[f.pid].append(f)
    deaths: dict[int, list[float]] = defaultdict(list)
    for pid, events in by_pid.items():
        for i, f in enumerate(events):
            if f.event == "kill":
                deaths[pid].append(f.at)
            elif f.event == "stop":
                cont = next((g.at for g in events[i + 1 :] if g.event == "cont"), math.inf)
                if cont - f.at > lease:
                    frozen = single_writer and cont < math.inf
                    deaths[pid].append(max(f.at, cont - lease) if frozen else f.at)
    return deaths


def _reclaim_latency(
    h: _History,
    attempt: Attempt,
    pids: set[int],
    faults: Sequence[FaultEvent],
    lease: float,
    single_writer: bool = False,
) -> tuple[float, float, int] | None:
    """(latency, fault time, pid) for a ``lease_lost`` attempt whose worker died."""
    started, finished = _started(attempt), _finished(attempt)
    own = [f for f in faults if f.pid in pids]
    deaths = _deaths(own, h.task.lease or lease, single_writer)
    candidates = [
        (t, pid)
        for pid, times in deaths.items()
        for t in times
        if started <= t and (finished is None or t <= finished)
    ]
    if not candidates:
        return None
    died, pid = min(candidates)
    following = h.after(attempt)
    reclaimed = finished if following is None else _started(following)
    if reclaimed is None:
        return None
    return reclaimed - died, died, pid


@dataclass(slots=True)
class _Reclaims:
    latencies: list[float] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)


def _check_reclaims(
    h: _History,
    workers: Mapping[str, set[int]],
    faults: Sequence[FaultEvent],
    lease: float,
    bound: float,
    into: _Reclaims,
    single_writer: bool = False,
) -> None:
    """Measure each ``lease_lost`` attempt whose worker (its pid known from the
    ledger) died while holding it."""
    for attempt in h.attempts:
        pids = workers.get(attempt.worker_id)
        if attempt.outcome is not Outcome.LEASE_LOST or not pids:
            continue
        measured = _reclaim_latency(h, attempt, pids, faults, lease, single_writer)
        if measured is None:
            continue
        latency, _died, pid = measured
        into.latencies.append(latency)
        task_bound = bound - lease + (h.task.lease or lease)
        if latency > task_bound:
            detail = (
                f"attempt {attempt.number} on pid {pid} ({attempt.worker_id}) "
                f"reclaimed {latency:.2f}s after its worker died (bound {task_bound:.2f}s)"
            )
            into.violations.append(_v(Kind.SLOW_RECLAIM, h.task, detail))


def _restarts(faults: Sequence[FaultEvent], initial_workers: int | None) -> int:
    ordered = sorted(faults, key=lambda f: f.at)
    spawns = sum(1 for f in ordered if f.event == "spawn")
    if initial_workers is None:
        initial_workers = 0
        for f in ordered:
            if f.event in ("kill", "stop", "term"):
                break
            initial_workers += f.event == "spawn"
    return max(spawns - initial_workers, 0)


# -- chords --------------------------------------------------------------------


def _chord_attempts(h: _History) -> list[Violation]:
    """The callback ended ``succeeded`` by exactly one succeeded attempt."""
    won = [a.number for a in h.attempts if a.outcome is Outcome.SUCCEEDED]
    if h.task.state is TaskState.SUCCEEDED and len(won) == 1:
        return []
    detail = f"callback ended {h.task.state} with succeeded attempts {won}, not exactly one"
    return [_v(Kind.CHORD, h.task, detail)]


def _chord_members(
    callback: Task, members: Sequence[int], tasks: Mapping[int, Task]
) -> list[Violation]:
    """Every member ended ``succeeded``, and the callback's result is their results in order."""
    found = []
    results: list[Any] = []
    for member in members:
        task = tasks.get(member)
        if task is None or task.state is not TaskState.SUCCEEDED:
            state = "missing" if task is None else task.state
            found.append(_v(Kind.CHORD, callback, f"member {member} ended {state}, not succeeded"))
        results.append(None if task is None else task.result)
    if callback.state is TaskState.SUCCEEDED and callback.result != results:
        detail = f"callback returned {callback.result!r}, its members {results!r}"
        found.append(_v(Kind.CHORD, callback, detail))
    return found


def _member_runs(h: _History) -> list[_Run]:
    """A member's executions but the zombies: those of an attempt that ended
    ``lease_lost`` before a later attempt, whose completion the store refused
    (their late ``end`` lines say nothing of when the member ended)."""
    last = h.attempts[-1].number if h.attempts else 0
    zombies = {a.number for a in h.attempts if a.outcome is Outcome.LEASE_LOST and a.number < last}
    return [r for r in h.runs if r.attempt not in zombies]


def _chord_order(
    callback: Task, began: float, member: _History, kills: Mapping[int, list[float]]
) -> list[Violation]:
    """The callback's first start came after the member's last execution
    ended (it was released by the member's end, never before), and no
    execution of the member started after it."""
    found = []
    for run in _member_runs(member):
        until = _until(run, member.attempt(run.attempt), kills)
        if run.start > began:
            detail = (
                f"member {member.task.id} attempt {run.attempt} started "
                f"{run.start - began:.3f}s after the callback started"
            )
            found.append(_v(Kind.EARLY_CALLBACK, callback, detail))
        elif until > began:
            ended = "never ended" if math.isinf(until) else f"ended {until - began:.3f}s after"
            detail = (
                f"the callback started before member {member.task.id} attempt "
                f"{run.attempt} ended (it {ended} the callback started)"
            )
            found.append(_v(Kind.EARLY_CALLBACK, callback, detail))
    return found


def _check_chords(
    chords: Sequence[tuple[Sequence[int], int]],
    histories: Mapping[int, _History],
    kills: Mapping[int, list[float]],
) -> list[Violation]:
    """``chord`` and ``early_callback``: each chord's callback ended
    ``succeeded`` by exactly one succeeded attempt (its other attempts, if
    any, are checked as any task's), with its members' results in order;
    every member ended ``succeeded``; and, by the ledger, the callback's
    first execution started after every member's last execution ended,
    and no member started again after it (a member's executions under an
    attempt that lost its lease to a later one are not counted: the store
    refused their completion). ``histories``: every stored task's; a
    callback missing from the store is reported as ``lost``."""
    found = []
    for members, callback_id in chords:
        h = histories.get(callback_id)
        if h is None:
            continue
        found += _chord_attempts(h)
        found += _chord_members(
            h.task, members, {m: histories[m].task for m in members if m in histories}
        )
        began = min((r.start for r in h.runs), default=None)
        if began is None:
            if h.task.state is TaskState.SUCCEEDED:
                detail = "callback succeeded without an execution in the ledger"
                found.append(_v(Kind.CHORD, h.task, detail))
            continue
        for member in members:
            if member in histories:
                found += _chord_order(h.task, began, histories[member], kills)
    return found


# -- the whole run -------------------------------------------------------------


def check(
    *,
    tasks: Mapping[int, Task],
    enqueued: Sequence[int],
    ledger: Sequence[Execution],
    faults: Sequence[FaultEvent],
    lease: float,
    poll_interval: float,
    control: bool = False,
    initial_workers: int | None = None,
    reclaim_slack: float = DEFAULT_RECLAIM_SLACK,
    single_writer: bool = False,
    expected: Mapping[int, Expected] | None = None,
    ticks: Sequence[Task] = (),
    tick_seconds: float = 1.0,
    races: Sequence[Task] = (),
    race_answers: Sequence[Mapping[int, int] | None] = (),
    race_keys: int = 0,
    chords: Sequence[tuple[Sequence[int], int]] = (),
) -> Report:
    """Check a run's history; every violation found, not just the first.

    ``tasks``: the stored tasks by id, with their attempts. ``enqueued``: the
    ids whose enqueue was acknowledged. ``lease`` and ``poll_interval``: the
    workers' settings (a task's own lease wins). ``control``: a fault-free
    run. ``ticks``: the tasks a schedule of ``tick_seconds`` slots enqueued
    (each slot once, none missing between the first and the last; they are
    in ``tasks`` too). ``races``: the tasks of the unique race, whose racers
    were answered ``race_answers`` (key to id; None: a racer failed) for
    keys ``0..race_keys-1`` (see :func:`_check_unique`). ``chords``: each
    chord's member ids and callback id (see :func:`_check_chords`). ``initial_workers``:
    workers spawned at the start (default: the spawns before the first kill,
    stop or term). ``single_writer``: the
    store has one writer at a time (SQLite), see ``_deaths``. ``expected``:
    what some succeeded tasks' results must be.
    """
    acknowledged = list(dict.fromkeys(enqueued))
    runs = _pair(ledger)
    runs_by_task: dict[int, list[_Run]] = defaultdict(list)
    workers: dict[str, set[int]] = defaultdict(set)
    for run in runs:
        runs_by_task[run.task].append(run)
        workers[run.worker].add(run.pid)
    kills: dict[int, list[float]] = defaultdict(list)
    for f in sorted(faults, key=lambda f: f.at):
        if f.event == "kill":
            kills[f.pid].append(f.at)

    violations = _check_lost(tasks, acknowledged) + _check_schedule(ticks, tick_seconds)
    violations += _check_unique(races, race_answers, race_keys)
    violations += [
        Violation(Kind.HUNG_WORKER, None, f"worker pid {f.pid} did not exit after SIGTERM")
        for f in faults
        if f.event == "hung"
    ]
    reclaims = _Reclaims()
    duplicates = explained = 0
    names: dict[str, NameCounts] = defaultdict(NameCounts)
    histories = {
        task_id: _History(
            task, tuple(sorted(task.attempts, key=lambda a: a.number)), tuple(runs_by_task[task_id])
        )
        for task_id, task in tasks.items()
    }
    violations += _check_chords(chords, histories, kills)
    for task_id in sorted(tasks):
        task = tasks[task_id]
        h = histories[task_id]
        names[task.name] = names[task.name].add(h, kills)
        violations += _check_success(h)
        violations += _check_attempt_numbers(h)
        violations += _check_executions(h)
        overlaps, zombie = _check_overlaps(h, kills)
        violations += overlaps
        if control:
            violations += _check_control(h)
        if expected is not None and task_id in expected:
            violations += _check_result(task, expected[task_id])
        duplicates += h.duplicated
        explained += zombie
        bound = lease + poll_interval + reclaim_slack
        _check_reclaims(h, workers, faults, lease, bound, reclaims, single_writer)
    violations += reclaims.violations

    states = Counter(tasks[i].state for i in acknowledged if i in tasks)
    return Report(
        enqueued=len(acknowledged),
        terminal=sum(n for state, n in states.items() if state.is_terminal),
        succeeded=states[TaskState.SUCCEEDED],
        failed=states[TaskState.FAILED],
        cancelled=states[TaskState.CANCELLED],
        lost=sum(v.kind is Kind.LOST for v in violations),
        duplicates=duplicates,
        duplicates_explained=explained,
        stale_writes_rejected=_rejected(tasks, runs),
        stale_writes_accepted=sum(v.kind is Kind.STALE_WRITE_ACCEPTED for v in violations),
        handlers_stopped=_stopped(tasks, runs, kills),
        worst_reclaim_seconds=max(reclaims.latencies, default=None),
        reclaims=len(reclaims.latencies),
        worker_restarts=_restarts(faults, initial_workers),
        violations=tuple(violations),
        names=dict(names),
    )


def _stopped(
    tasks: Mapping[int, Task], runs: Iterable[_Run], kills: Mapping[int, list[float]]
) -> int:
    """Executions under a ``lease_lost`` attempt with no ``end`` in a process
    not killed after they began."""
    outcomes = {(t.id, a.number): a.outcome for t in tasks.values() for a in t.attempts}
    return sum(
        1
        for r in runs
        if r.end is None
        and outcomes.get((r.task, r.attempt)) is Outcome.LEASE_LOST
        and not any(k >= r.start for k in kills.get(r.pid, []))
    )


def _rejected(tasks: Mapping[int, Task], runs: Iterable[_Run]) -> int:
    """Executions that reached their ``end`` under an attempt that ended ``lease_lost``."""
    outcomes = {(t.id, a.number): a.outcome for t in tasks.values() for a in t.attempts}
    return sum(
        1
        for r in runs
        if r.end is not None and outcomes.get((r.task, r.attempt)) is Outcome.LEASE_LOST
    )


__all__ = [
    "Execution",
    "Expected",
    "FaultEvent",
    "HistoryError",
    "Kind",
    "NameCounts",
    "Report",
    "Violation",
    "check",
    "read_events",
    "read_faults",
    "read_ledger",
]
