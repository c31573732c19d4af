"""The pure core: tasks, attempt outcomes, leases and the retry policy (task
states and their legal moves are :mod:`conveyor.states`).

Nothing here does I/O or knows a backend; every other module speaks these
types. Times are timezone-aware UTC datetimes taken from the backend's clock
(the only authority on lease expiry).
"""

from __future__ import annotations

import enum
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from conveyor.errors import LONGEST_PAUSE, ConfigurationError, TaskNotFoundError

# The state machine is conveyor.states; its names stay importable from here.
from conveyor.states import (
    STATE_CHANGES as STATE_CHANGES,
)
from conveyor.states import (
    TERMINAL_STATES as TERMINAL_STATES,
)
from conveyor.states import (
    Cause as Cause,
)
from conveyor.states import (
    IllegalStateChangeError as IllegalStateChangeError,
)
from conveyor.states import (
    StateChange as StateChange,
)
from conveyor.states import (
    TaskState as TaskState,
)
from conveyor.states import (
    allowed as allowed,
)
from conveyor.states import (
    causes as causes,
)
from conveyor.states import (
    check_state_change as check_state_change,
)


class Outcome(enum.StrEnum):
    """How one attempt ended (``in_progress`` while it runs)."""

    IN_PROGRESS = "in_progress"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    LEASE_LOST = "lease_lost"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"
    INTERRUPTED = "interrupted"


# Defaults shared by the decorator, the worker and the backends.
DEFAULT_QUEUE = "default"
DEFAULT_LEASE_SECONDS = 30.0
MIN_LEASE_SECONDS = 0.5
DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024
MAX_SECONDS = LONGEST_PAUSE
"""The longest duration conveyor takes (a delay, lease, timeout or retry
interval): 100 years. Anything longer is a mistake, and a time that far
ahead would not fit the stores' timestamps (or Python's ``datetime``)."""
EARLIEST_RUN_AT = datetime(1, 1, 2, tzinfo=UTC)
LATEST_RUN_AT = datetime(9999, 12, 30, tzinfo=UTC)
"""The run times every store holds (PostgreSQL's ``tasks_run_at_in_range``);
an enqueue's ``run_at`` outside them raises ConfigurationError."""
MAX_ATTEMPTS = 1_000_000_000
"""The largest ``max_attempts``; attempt counters are 32-bit integers."""
MAX_COUNTER = 2_147_483_645
"""The largest attempt or spent counter a claim still takes: the next claim
must fit a 32-bit integer. The stores refuse larger ones, and a task whose
counter stands at the limit (written around conveyor) ends ``failed``."""


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """When to retry a failed attempt.

    The delay before attempt ``n + 1`` (after ``n`` failed attempts) is
    ``min(max_interval, initial_interval * backoff_coefficient ** (n - 1))``,
    then spread by ``±jitter`` (a fraction of the delay). ``max_attempts``
    counts every attempt, the first included, and reclaims after a crash.

    ``fatal`` names the exceptions no retry can fix: an attempt that raises
    one (or a subclass) fails the task at once, like ``conveyor.Fatal``.
    ``retry_on``, when given, names the only exceptions that are retried:
    any other fails the task at once (``fatal`` wins where both match). Each
    takes exception classes or their qualified names (``"module.Class"``,
    the bare name for builtins); the policy keeps and stores the names, so a
    stored task is matched by name, through each class an error derives
    from, in a thread, a child process or another release of the code alike.
    Timeouts and lost leases are not exceptions a handler raised: they
    follow the budget, whatever these say.
    """

    max_attempts: int = 5
    initial_interval: float = 1.0
    max_interval: float = 60.0
    backoff_coefficient: float = 2.0
    jitter: float = 0.1
    retry_on: tuple[str | type[BaseException], ...] = ()
    fatal: tuple[str | type[BaseException], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "retry_on", error_names("retry_on", self.retry_on))
        object.__setattr__(self, "fatal", error_names("fatal", self.fatal))
        if not isinstance(self.max_attempts, int) or not 1 <= self.max_attempts <= MAX_ATTEMPTS:
            raise ConfigurationError(
                f"RetryPolicy.max_attempts must be an integer from 1 to {MAX_ATTEMPTS}"
            )
        for name in ("initial_interval", "max_interval", "backoff_coefficient", "jitter"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ConfigurationError(f"RetryPolicy.{name} must be a finite number >= 0")
        for name in ("initial_interval", "max_interval"):
            if getattr(self, name) > MAX_SECONDS:
                raise ConfigurationError(f"RetryPolicy.{name} must be at most {MAX_SECONDS:.0f}s")
        if self.backoff_coefficient < 1:
            raise ConfigurationError("RetryPolicy.backoff_coefficient must be at least 1")
        if self.jitter > 1:
            raise ConfigurationError("RetryPolicy.jitter is a fraction between 0 and 1")

    def delay(self, failed_attempts: int, rng: random.Random | None = None) -> float:
        """Seconds to wait before the next attempt after ``failed_attempts`` failures."""
        exponent = max(failed_attempts - 1, 0)
        try:
            base = self.initial_interval * self.backoff_coefficient**exponent
        except OverflowError:
            base = self.max_interval
        base = min(base, self.max_interval)
        if self.jitter and base:
            spread = base * self.jitter
            base += (rng or random).uniform(-spread, spread)
        return max(base, 0.0)

    def gives_up_on(self, error_types: Sequence[str]) -> bool:
        """Whether an error whose classes (itself first, then each it derives
        from, by :func:`qualified_name`) are ``error_types`` must not be
        retried: one is ``fatal``, or ``retry_on`` is given and none is in it."""
        if any(name in self.fatal for name in error_types):
            return True
        return bool(self.retry_on) and not any(name in self.retry_on for name in error_types)

    def to_json(self) -> dict[str, Any]:
        """The policy as a JSON object, as it is stored with each task."""
        data: dict[str, Any] = {
            "max_attempts": self.max_attempts,
            "initial_interval": self.initial_interval,
            "max_interval": self.max_interval,
            "backoff_coefficient": self.backoff_coefficient,
            "jitter": self.jitter,
        }
        if self.retry_on:
            data["retry_on"] = list(self.retry_on)
        if self.fatal:
            data["fatal"] = list(self.fatal)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RetryPolicy:
        """The policy :meth:`to_json` wrote (a missing ``jitter`` is 0)."""
        return cls(
            max_attempts=int(data["max_attempts"]),
            initial_interval=float(data["initial_interval"]),
            max_interval=float(data["max_interval"]),
            backoff_coefficient=float(data["backoff_coefficient"]),
            jitter=float(data.get("jitter", 0.0)),
            retry_on=tuple(data.get("retry_on", ())),
            fatal=tuple(data.get("fatal", ())),
        )


MAX_TASK_ID = 2**63 - 1
"""Task ids are positive 64-bit integers (PostgreSQL's bigint, SQLite's integer)."""


def findable(task_id: int) -> bool:
    """Whether a task could have id ``task_id``: one that cannot (0,
    negative, or past :data:`MAX_TASK_ID`) is answered as missing without
    asking the store, on every backend alike (a store would otherwise refuse
    the number itself, as SQLite refuses a Python int past 64 bits). Raises
    ConfigurationError for what is not an int."""
    if isinstance(task_id, bool) or not isinstance(task_id, int):
        raise ConfigurationError(f"a task id is an int, not {type(task_id).__name__}")
    return 0 < task_id <= MAX_TASK_ID


def stored_id(task_id: int) -> int:
    """``task_id``, for a change to a task: TaskNotFoundError before any I/O
    if no task can have it (see :func:`findable`)."""
    if not findable(task_id):
        raise TaskNotFoundError(f"no task with id {task_id}")
    return task_id


MAX_ERROR_NAMES = 64
"""The most exception names a policy's ``retry_on`` or ``fatal`` takes."""


def qualified_name(kind: type) -> str:
    """How an error's class is named in the attempt log and a retry policy:
    ``ValueError`` for builtins, else ``module.QualifiedName``."""
    if kind.__module__ == "builtins":
        return kind.__qualname__
    return f"{kind.__module__}.{kind.__qualname__}"


def error_types(exc: BaseException) -> tuple[str, ...]:
    """The qualified names of ``exc``'s class and of each class it derives from."""
    return tuple(qualified_name(kind) for kind in type(exc).__mro__)


def error_names(field_name: str, given: object) -> tuple[str, ...]:
    """``given`` (exception classes or qualified names) as sorted, distinct
    names; anything else raises ConfigurationError."""
    if isinstance(given, str | type):
        given = (given,)
    if not isinstance(given, tuple | list | set | frozenset):
        raise ConfigurationError(
            f"RetryPolicy.{field_name} must be a tuple of exception classes or their names"
        )
    names: set[str] = set()
    for item in given:
        if isinstance(item, type) and issubclass(item, BaseException):
            names.add(qualified_name(item))
        elif isinstance(item, str) and 0 < len(item) <= 255 and item.isprintable():
            names.add(item)
        else:
            raise ConfigurationError(
                f"RetryPolicy.{field_name} takes exception classes or their qualified names, "
                f"not {item!r}"
            )
    if len(names) > MAX_ERROR_NAMES:
        raise ConfigurationError(
            f"RetryPolicy.{field_name} takes at most {MAX_ERROR_NAMES} exceptions"
        )
    return tuple(sorted(names))


DEFAULT_RETRY = RetryPolicy()


def check_duration(name: str, value: float | None, minimum: float = 0.0) -> float | None:
    """Validate an optional duration in seconds (from ``minimum`` to
    ``MAX_SECONDS``); return it as a float."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise ConfigurationError(f"{name} must be a number of seconds, not {value!r}") from None
    if not math.isfinite(seconds) or not minimum <= seconds <= MAX_SECONDS:
        raise ConfigurationError(
            f"{name} must be a finite number of seconds from {minimum} to {MAX_SECONDS:.0f}"
        )
    return seconds


MAX_IDEMPOTENCY_KEY = 255
"""The longest idempotency key, in characters."""


def check_key(what: str, key: object) -> str:
    """Validate a key (idempotency, unique, concurrency, rate limit): 1 to
    ``MAX_IDEMPOTENCY_KEY`` characters of text every store can hold (no NUL,
    no lone surrogate); ``what`` names it in the ConfigurationError."""
    if not isinstance(key, str) or not 0 < len(key) <= MAX_IDEMPOTENCY_KEY:
        raise ConfigurationError(
            f"{what} must be a string of 1 to {MAX_IDEMPOTENCY_KEY} characters, not {key!r:.80}"
        )
    if "\x00" in key or not _encodable(key):
        raise ConfigurationError(f"{what} must be valid text without NUL")
    return key


def check_idempotency_key(key: str | None) -> str | None:
    """Validate an optional idempotency key (see :func:`check_key`)."""
    return None if key is None else check_key("an idempotency key", key)


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def batch_keys(key: str | None, count: int) -> list[str | None]:
    """The idempotency keys of a batch of ``count`` tasks enqueued under
    ``key``: ``key#0``, ``key#1``, ... (none without a key)."""
    checked = check_idempotency_key(key)
    if checked is None:
        return [None] * count
    return [f"{checked}#{index}" for index in range(count)]


@dataclass(frozen=True, slots=True)
class LeaseToken:
    """Identifies one lease: the worker that holds it and the attempt number.

    Attempt numbers grow by one at every claim of a task, so a token is never
    reused; every write a worker makes about a task is conditioned on it.

    ``nonce`` is a random value of the claim that handed the lease out, where
    the backend keeps one (Redis; "" elsewhere), checked with the rest: a
    store that lost its data and hands a task id out again (a restart
    without persistence) never takes an older attempt's token for the new
    task's, even from the same worker with the same attempt number.
    """

    task_id: int
    attempt: int
    worker_id: str
    nonce: str = ""


@dataclass(frozen=True, slots=True)
class Attempt:
    """One row of the attempt log: one claim of a task by a worker."""

    task_id: int
    number: int
    worker_id: str
    outcome: Outcome
    started_at: datetime
    finished_at: datetime | None = None
    error_type: str | None = None
    error_message: str | None = None
    traceback: str | None = None
    step: str | None = None
    """The workflow step this attempt ran (None for plain tasks)."""


@dataclass(frozen=True, slots=True)
class Task:
    """A task as stored, with its state and (when asked for) its attempts.

    A ``payload`` or ``result`` whose stored JSON does not decode (written
    around conveyor) is given as its stored text, so that the task and the
    failed attempt that reports it stay readable.
    """

    id: int
    name: str
    queue: str
    payload: Any
    state: TaskState
    priority: int
    run_at: datetime
    attempt: int
    max_attempts: int
    retry: RetryPolicy
    timeout: float | None
    lease: float | None
    result: Any
    created_at: datetime
    finished_at: datetime | None
    worker_id: str | None
    lease_expires_at: datetime | None
    cancel_requested: bool
    attempts: tuple[Attempt, ...] = field(default=())
    step: str | None = None
    """A step workflow's current step (its state is ``payload``); None for plain tasks."""
    parent_id: int | None = None
    """The coroutine task that spawned this one (None for a root task)."""
    inbox: bool = False
    """True for a coroutine task: it takes messages (``payload`` is its state)."""
    idempotency_key: str | None = None
    """The key it was enqueued under, if any (see ``App.enqueue``)."""
    concurrency_key: str | None = None
    """Its concurrency (or rate) key, if any: the flow control it waits on."""
    waiting_for: int | None = None
    """How many of its dependencies (``after``) have not ended yet as its
    policy counts them; None for a task without dependencies."""
    progress: Progress | None = None
    """The latest progress its attempts reported (None: none reported)."""

    @property
    def last_attempt(self) -> Attempt | None:
        """The latest attempt; None if there is none yet, or if the task was
        read without its attempts."""
        return self.attempts[-1] if self.attempts else None


class MessageKind(enum.StrEnum):
    """``message``: sent by code (a task or the outside). ``end``: a child's
    end-of-stream, sent by the store when the child finished."""

    MESSAGE = "message"
    END = "end"


@dataclass(frozen=True, slots=True)
class Message:
    """One message in a coroutine task's inbox, as its poll sees it.

    ``body`` is the decoded JSON. An ``end`` message's body is
    ``{"child": id, "name": ..., "state": ..., "result": ...}``.
    ``sender_id`` is the sending task (None when sent from outside).
    """

    id: int
    task_id: int
    sender_id: int | None
    kind: MessageKind
    body: Any
    created_at: datetime
    trace: str | None = None
    """The sender's trace context, as stored (see :mod:`conveyor.tracing`)."""

    @property
    def is_end(self) -> bool:
        """True for a child's end message (``kind`` is ``end``)."""
        return self.kind is MessageKind.END


class PauseKind(enum.StrEnum):
    """What a pause holds back: every task of a ``queue``, or of a ``task`` name."""

    QUEUE = "queue"
    TASK = "task"


@dataclass(frozen=True, slots=True)
class Pause:
    """A paused queue or task name: no worker starts an attempt of a task
    that it holds back (not even a reclaim); running attempts go on. Stored,
    so it outlives every worker until it is resumed."""

    kind: PauseKind
    name: str
    paused_at: datetime


MAX_NAME = 200
"""The longest task, queue, pause or schedule name, in characters."""


def check_name(what: str, name: object) -> str:
    """``name`` checked by the one rule of every task, queue, pause and
    schedule name: a string of 1 to ``MAX_NAME`` printable characters
    (``str.isprintable``: no newline, tab or other control character, no
    NUL, no lone surrogate, no format character, no separator but the
    space), which every store holds and every listing shows on one line.
    Else ConfigurationError naming ``what``. No I/O."""
    if isinstance(name, str) and 0 < len(name) <= MAX_NAME and name.isprintable():
        return name
    shown = (
        repr(name[:60]) + ("..." if len(name) > 60 else "")
        if isinstance(name, str)
        else (type(name).__name__)
    )
    raise ConfigurationError(
        f"{what} must be 1 to {MAX_NAME} printable characters (no newline, control "
        f"character, NUL or lone surrogate), not {shown}"
    )


MAX_PROGRESS = 2**53
"""The largest ``done`` or ``total`` a progress report may give (every store
and JSON reader holds it exactly)."""
MAX_PROGRESS_NOTE = 200
"""The longest progress note, in characters."""


@dataclass(frozen=True, slots=True)
class Progress:
    """The latest progress an attempt of a task reported (see
    :meth:`~conveyor.context.TaskContext.progress`): ``done`` of ``total``
    (None: the total is not known) and a short ``note``, reported by attempt
    number ``attempt`` and stored at ``at`` (the store's clock).

    It is the last report the store accepted, not a live count: reports are
    written at most once per worker's progress interval, and the last one
    when the attempt ends. It stays when the attempt ends (a failed task
    shows how far it got) until a later attempt reports its own."""

    done: int
    total: int | None
    note: str | None
    attempt: int
    at: datetime

    @property
    def fraction(self) -> float | None:
        """``done / total`` (0.0 to 1.0); None without a total, 1.0 for a total of 0."""
        if self.total is None:
            return None
        return 1.0 if self.total == 0 else self.done / self.total

    def summary(self) -> str:
        """One line for people: ``37 of 100 (37%): resizing`` (``37`` alone
        without a total; the note, stored text, as given)."""
        fraction = self.fraction
        shown = str(self.done)
        if self.total is not None and fraction is not None:
            shown = f"{self.done} of {self.total} ({math.floor(fraction * 100)}%)"
        return shown if self.note is None else f"{shown}: {self.note}"


def check_progress(done: object, total: object, note: object) -> tuple[int, int | None, str | None]:
    """A progress report checked by its one rule: ``done`` an integer from 0
    to ``MAX_PROGRESS``; ``total`` None or an integer from ``done`` to
    ``MAX_PROGRESS``; ``note`` None or up to ``MAX_PROGRESS_NOTE`` printable
    characters (one line, as :func:`check_name`). Else ConfigurationError.
    No I/O."""
    if not _count(done):
        raise ConfigurationError(
            f"progress done must be an integer from 0 to {MAX_PROGRESS}, not {done!r:.40}"
        )
    if total is not None and not (_count(total) and total >= done):  # type: ignore[operator]
        raise ConfigurationError(
            f"progress total must be None or an integer from done ({done}) to "
            f"{MAX_PROGRESS}, not {total!r:.40}"
        )
    if note is not None and not (
        isinstance(note, str) and len(note) <= MAX_PROGRESS_NOTE and note.isprintable()
    ):
        shown = repr(note[:60]) if isinstance(note, str) else type(note).__name__
        raise ConfigurationError(
            f"a progress note must be up to {MAX_PROGRESS_NOTE} printable characters "
            f"(one line, no control character), not {shown}"
        )
    return done, total, note  # type: ignore[return-value]


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_PROGRESS


MAX_TASK_ID_DIGITS = 18
"""The most digits a task id read from text may have (ids fit a signed 64-bit integer)."""


def parse_task_id(text: object, what: str = "a task id") -> int:
    """``text`` read as a task id: 1 to ``MAX_TASK_ID_DIGITS`` ASCII digits
    (``0-9`` only: no sign, space, underscore, or other script's digits,
    which ``str.isdigit`` and ``int`` would take). Else ConfigurationError
    naming ``what``. The one rule of every place that reads an id from text
    (the dashboard's addresses and forms, the command line). No I/O."""
    if (
        isinstance(text, str)
        and 0 < len(text) <= MAX_TASK_ID_DIGITS
        and text.isascii()
        and text.isdigit()
    ):
        return int(text)
    shown = repr(text[:30]) + ("..." if len(text) > 30 else "") if isinstance(text, str) else ""
    raise ConfigurationError(
        f"{what} must be a task id (1 to {MAX_TASK_ID_DIGITS} digits 0-9), not "
        f"{shown or type(text).__name__}"
    )


def check_pause(kind: object, name: object) -> tuple[PauseKind, str]:
    """``kind`` and ``name`` of a pause, checked: a :class:`PauseKind` (or its
    value) and a name by :func:`check_name`; else ConfigurationError."""
    try:
        checked = PauseKind(kind if isinstance(kind, str) else "")
    except ValueError:
        raise ConfigurationError(f"a pause is of a 'queue' or a 'task', not {kind!r}") from None
    return checked, check_name(f"a paused {checked.value} name", name)
