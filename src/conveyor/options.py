"""Per-call options: how one enqueue, start or spawn differs from its task's defaults.

Every way of starting work takes the same frozen :class:`EnqueueOptions`:
``task.options(...)``, ``App.enqueue``/``enqueue_many``, ``workflow.start``,
``coroutine.start``, ``poll.spawn`` and ``conveyor enqueue``. A field left
None keeps the task's own default. Options are checked when they are made,
before any I/O: a wrong type or value, or a name that is not an option,
raises ConfigurationError (naming the valid options).

Each option is declared once, as a field of :class:`EnqueueOptions` with its
:class:`Spec`: its check, whether a task's defaults hold it
(:data:`TASK_DEFAULTS`, the fields of ``conveyor.task.TaskOptions``) and its
``conveyor enqueue`` flag. The keyword form :class:`OptionFields` and
``App.task``'s parameters restate them for type checkers;
``tests/test_options.py`` keeps them the same.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, Protocol, TypedDict

from conveyor.backends.params import AFTER_POLICIES
from conveyor.errors import ConfigurationError
from conveyor.model import (
    EARLIEST_RUN_AT,
    LATEST_RUN_AT,
    MIN_LEASE_SECONDS,
    RetryPolicy,
    check_duration,
    check_idempotency_key,
    check_key,
    check_name,
    parse_task_id,
    stored_id,
)

UniqueScope = Literal["pending", "active", "stored"]
OnConflict = Literal["existing", "replace", "raise"]
SCOPES = ("pending", "active", "stored")
ON_CONFLICT = ("existing", "replace", "raise")


@dataclass(frozen=True, slots=True, kw_only=True)
class Unique:
    """At most one task of a name per key, within a scope.

    ``key`` is the unique key: a string, a function of the payload's
    arguments (``lambda args: f"user:{args['user_id']}"``), or None for the
    payload itself (its canonical JSON, hashed): identical payloads are one
    task. Keys are per task name.

    ``scope`` says how long a task holds its key: ``"pending"`` until a
    worker starts it (a task already running does not hold back a new
    one), ``"active"`` (default) until it finishes, ``"stored"`` as long as
    it is stored (an idempotency key: until retention deletes it), or a
    duration (seconds or a timedelta) after its enqueue, whatever its state.
    A task whose scope ended never takes its key back (a retry of a failed
    task does not).

    ``on_conflict`` says what an enqueue whose key is held does:
    ``"existing"`` (default) stores nothing and returns the holder's
    handle; ``"replace"`` gives the holder this enqueue's payload, priority
    and due time if it is still pending (else it is left as it is) and
    returns its handle; ``"raise"`` raises TaskExistsError, storing
    nothing of the enqueue (of a whole ``enqueue_many``).

    Race-free: the store's unique index on (name, key) decides, so
    concurrent enqueues from any number of processes, in callers'
    transactions or not, store one task per held key.
    """

    key: str | Callable[[Mapping[str, Any]], str] | None = None
    scope: UniqueScope | float | timedelta = "active"
    on_conflict: OnConflict = "existing"

    def __post_init__(self) -> None:
        if isinstance(self.key, str):
            check_key("Unique.key", self.key)
        elif self.key is not None and not callable(self.key):
            raise ConfigurationError("Unique.key is a string, a function of the arguments, or None")
        scope = self.scope
        if isinstance(scope, timedelta):
            scope = scope.total_seconds()
        if isinstance(scope, int | float) and not isinstance(scope, bool):
            object.__setattr__(self, "scope", check_duration("Unique.scope", scope, minimum=0.001))
        elif scope not in SCOPES:
            raise ConfigurationError(
                f"Unique.scope is one of {', '.join(SCOPES)} or a duration, not {scope!r}"
            )
        if self.on_conflict not in ON_CONFLICT:
            raise ConfigurationError(
                f"Unique.on_conflict is one of {', '.join(ON_CONFLICT)}, not {self.on_conflict!r}"
            )

    def key_for(self, args: Mapping[str, Any], payload: str) -> str:
        """The key of a task with these arguments (``payload``: their JSON)."""
        if self.key is None:
            canonical = json.dumps(json.loads(payload), sort_keys=True, separators=(",", ":"))
            return "payload:" + hashlib.sha256(canonical.encode()).hexdigest()[:32]
        return _key_of("unique", self.key, args)

    @property
    def period(self) -> float | None:
        """Seconds a task holds its key after its enqueue (a duration scope)."""
        return float(self.scope) if isinstance(self.scope, int | float) else None

    @property
    def state_scope(self) -> str | None:
        """``pending`` or ``active`` (the key is released when the task leaves
        it), else None (held while stored, or for a period)."""
        return self.scope if self.scope in ("pending", "active") else None  # type: ignore[return-value]


MAX_CONCURRENCY_LIMIT = 1_000_000


@dataclass(frozen=True, slots=True, kw_only=True)
class Concurrency:
    """At most ``limit`` attempts of the tasks that share a key run at once,
    across every worker, whatever their task names.

    ``key`` is a string or a function of the payload's arguments
    (``lambda args: f"user:{args['user_id']}"``). Enqueues never fail
    because a key is full: its tasks wait, pending, while tasks of other
    keys and plain tasks run. When tasks of one key give different limits,
    the limit of the key's last claimed task applies. Keyed tasks are
    claimed in claim order within their keys; between keys, the key claimed
    from longest ago goes first.
    """

    key: str | Callable[[Mapping[str, Any]], str]
    limit: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.key, str):
            check_key("Concurrency.key", self.key)
        elif not callable(self.key):
            raise ConfigurationError("Concurrency.key is a string or a function of the arguments")
        _check_limit("Concurrency.limit", self.limit)

    def key_for(self, args: Mapping[str, Any]) -> str:
        """The key of a task with these arguments."""
        return _key_of("concurrency", self.key, args)


@dataclass(frozen=True, slots=True, kw_only=True)
class RateLimit:
    """At most ``limit`` starts per ``per`` (seconds or a timedelta) of the
    tasks that share a key, across every worker.

    ``key`` is a string (``"queue:mail"`` for a queue's tasks, given on each
    of them), a function of the arguments, or None: the task's own name (all
    tasks of that name). The store keeps a token bucket per key: ``limit``
    tokens at most, refilled at ``limit`` per ``per``, one spent by each
    start; a start waits, pending, for a token. So a key starts at most
    ``limit`` tasks at once after a quiet spell and ``limit`` per ``per``
    sustained (in any window of ``per``: at most twice ``limit``).
    A task has one flow-control key: with a :class:`Concurrency` too, the
    rate applies to the concurrency key (give ``key`` None or the same).
    The rate a key's row was made with applies until the row is gone (the
    key drained and its bucket full again).
    """

    limit: int
    per: float | timedelta
    key: str | Callable[[Mapping[str, Any]], str] | None = None

    def __post_init__(self) -> None:
        _check_limit("RateLimit.limit", self.limit)
        per = self.per.total_seconds() if isinstance(self.per, timedelta) else self.per
        object.__setattr__(self, "per", check_duration("RateLimit.per", per, minimum=0.001))
        if isinstance(self.key, str):
            check_key("RateLimit.key", self.key)
        elif self.key is not None and not callable(self.key):
            raise ConfigurationError("RateLimit.key is a string, a function, or None")

    @property
    def seconds(self) -> float:
        """``per`` in seconds."""
        return self.per.total_seconds() if isinstance(self.per, timedelta) else float(self.per)

    def key_for(self, args: Mapping[str, Any], task_name: str) -> str:
        """The key of a task of ``task_name`` with these arguments."""
        if self.key is None:
            return f"task:{task_name}"
        return _key_of("rate limit", self.key, args)


def check_kind(name: str, value: object, kind: type) -> None:
    """Raise ConfigurationError unless ``value`` is None or a ``kind``."""
    if value is not None and not isinstance(value, kind):
        raise ConfigurationError(f"{name} must be a conveyor.{kind.__name__}")


def check_priority(priority: object) -> int:
    """``priority`` if it is an int that fits in 32 bits; else ConfigurationError."""
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise ConfigurationError("priority must be an integer")
    if not -(2**31) <= priority < 2**31:
        raise ConfigurationError("priority must fit in 32 bits")
    return priority


def _key_of(
    what: str, key: str | Callable[[Mapping[str, Any]], str], args: Mapping[str, Any]
) -> str:
    """``key`` itself, or what the function ``key`` makes of ``args``,
    checked (a failing function is a ConfigurationError naming ``what``)."""
    if isinstance(key, str):
        return key
    try:
        found = key(args)
    except Exception as exc:
        raise ConfigurationError(f"the {what} key function failed: {exc!r}") from exc
    return check_key(f"the {what} key function's result", found)


def _check_limit(what: str, limit: object) -> None:
    if (
        isinstance(limit, bool)
        or not isinstance(limit, int)
        or not 0 < limit <= MAX_CONCURRENCY_LIMIT
    ):
        raise ConfigurationError(f"{what} is an integer from 1 to {MAX_CONCURRENCY_LIMIT}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Flag:
    """An option's command-line form, ``conveyor enqueue --NAME``: ``kind``
    is what the flag's text is read as (a ``datetime``: a time, ISO 8601),
    ``minimum`` its lowest value, and ``to_value`` makes the option's value
    of it (None: the value itself)."""

    name: str
    kind: type = str
    minimum: float | None = None
    help: str | None = None
    to_value: Callable[[Any], Any] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Spec:
    """What :class:`EnqueueOptions` declares of one option, beside its name
    and type: ``check`` raises ConfigurationError for a bad value and returns
    the value kept (its normal form: ``delay`` in seconds); ``task_default``
    says whether a task's own defaults (:class:`conveyor.task.TaskOptions`)
    hold it, for the option to override; ``flag`` is its command-line form,
    if it has one."""

    check: Callable[[Any], Any]
    task_default: bool = False
    flag: Flag | None = None


SPEC = "conveyor.option"


def option(
    check: Callable[[Any], Any], *, task_default: bool = False, flag: Flag | None = None
) -> dict[str, Spec]:
    """The metadata of a field of :class:`EnqueueOptions`: its :class:`Spec`."""
    return {SPEC: Spec(check=check, task_default=task_default, flag=flag)}


def _kind(name: str, kind: type) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if not isinstance(value, kind):
            raise ConfigurationError(f"{name} must be a conveyor.{kind.__name__}")
        return value

    return check


def _duration(name: str, minimum: float) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        check_duration(name, value, minimum=minimum)
        return value

    return check


def _delay(value: Any) -> float | None:
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    return check_duration("delay", seconds)


def _run_at(value: Any) -> datetime:
    if not isinstance(value, datetime):
        raise ConfigurationError("run_at must be a datetime")
    if value.tzinfo is None:
        raise ConfigurationError("run_at must be timezone-aware")
    if not EARLIEST_RUN_AT <= value <= LATEST_RUN_AT:
        raise ConfigurationError(
            f"run_at must be from {EARLIEST_RUN_AT.date()} to "
            f"{LATEST_RUN_AT.date()} UTC (what every store holds), "
            f"not {value.isoformat()}"
        )
    return value


class Stored(Protocol):
    """A stored task's handle: what ``after`` takes besides an id."""

    @property
    def id(self) -> int: ...


After = Stored | int | Iterable[Stored | int]
"""What ``after`` takes: a handle, an id, or an iterable of these (a
group's handle iterates over its members)."""
AfterPolicy = Literal["cancel", "fail", "run"]


def check_after(value: Any) -> tuple[int, ...]:
    """``after``: the tasks a new task waits for, in order, as ids: a task
    handle (anything with an int ``id``), an id, or an iterable of these (a
    string is not one; a group's handle is its members). An id no task can
    have raises TaskNotFoundError, anything else ConfigurationError; no I/O."""
    if isinstance(value, str | bytes):
        raise ConfigurationError("after takes task handles or ids, not a string")
    if isinstance(value, int) or hasattr(value, "id"):
        value = [value]
    try:
        entries = list(value)
    except TypeError:
        raise ConfigurationError(
            f"after takes task handles or ids, not {type(value).__name__}"
        ) from None
    return tuple(stored_id(getattr(entry, "id", entry)) for entry in entries)


def parse_after(text: str) -> tuple[int, ...]:
    """``--after``'s text: task ids separated by commas (each as
    :func:`conveyor.model.parse_task_id` reads one)."""
    return tuple(parse_task_id(part.strip(), "--after") for part in text.split(","))


def check_after_policy(value: Any) -> str:
    """``on_dependency_failure``: ``cancel``, ``fail`` or ``run``."""
    if value not in AFTER_POLICIES:
        raise ConfigurationError(
            f"on_dependency_failure must be one of {', '.join(AFTER_POLICIES)}, not {value!r}"
        )
    return str(value)


def check_expires(value: Any) -> float | datetime:
    """``expires``: a duration (seconds or a timedelta, more than 0) or an
    aware datetime that every store holds; else ConfigurationError."""
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ConfigurationError("expires must be timezone-aware when it is a datetime")
        if not EARLIEST_RUN_AT <= value <= LATEST_RUN_AT:
            raise ConfigurationError(
                f"expires must be from {EARLIEST_RUN_AT.date()} to {LATEST_RUN_AT.date()} UTC"
            )
        return value
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    checked = check_duration("expires", seconds, minimum=0.001)
    assert checked is not None
    return checked


def expiry(
    expires: float | timedelta | datetime | None, run_at: datetime | None, delay: float
) -> datetime | None:
    """The time after which a task enqueued now no longer starts
    (``NewTask.expires_at``): ``expires`` itself, or that many seconds from
    now by this process's clock. ConfigurationError unless it is after the
    time the task is due (``run_at``, else ``delay`` seconds from now)."""
    if expires is None:
        return None
    now = datetime.now(UTC)
    if isinstance(expires, datetime):
        at = expires
    else:
        at = now + (expires if isinstance(expires, timedelta) else timedelta(seconds=expires))
    due = run_at if run_at is not None else now + timedelta(seconds=delay)
    if at <= due:
        raise ConfigurationError(
            f"expires ({at.isoformat()}) must be after the time the task is due ({due.isoformat()})"
        )
    return at


EXCLUSIVE = (("delay", "run_at"), ("idempotency_key", "unique"))
"""Pairs of options of which one call gives at most one (a later call's one
replaces the other: :meth:`EnqueueOptions.merge`)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class EnqueueOptions:
    """Options of one call that starts work; None keeps the task's default.

    ``queue`` and ``priority`` place the task; ``delay`` (seconds or a
    timedelta) or ``run_at`` (an aware datetime), at most one, say when it
    is due; ``retry``, ``timeout`` and ``lease`` govern its attempts (a
    workflow's come from its steps and cannot be given per call);
    ``idempotency_key`` makes the call safe to repeat (see
    :meth:`conveyor.App.enqueue`); it is ``Unique(key=..., scope="stored")``.
    ``unique`` makes the task unique by a key (see :class:`Unique`),
    overriding the task's own; give it or ``idempotency_key``, not both.
    ``concurrency`` limits how many tasks of a key run at once (see
    :class:`Concurrency`) and ``rate`` how many start per period (see
    :class:`RateLimit`), each overriding the task's own. ``expires`` (seconds
    or a timedelta from the call, by this process's clock, or an aware
    datetime) is when the task no longer starts: a claim that would start
    its first attempt at or after it ends it ``cancelled`` instead (see
    docs/guarantees.md, "Expiry"); it must be after the time the task is
    due. ``after`` (task handles, ids, or a group's handle) holds the task
    back until those tasks have ended: it runs once every one of them has
    succeeded; ``on_dependency_failure`` says what one that fails or is
    cancelled does to it: ``cancel`` it (the default), ``fail`` it, or
    ``run`` it anyway once all have ended (see docs/composition.md).

    Each field is the one declaration of its option (:class:`Spec`): its
    check, whether a task's defaults hold it, and its command-line form.
    """

    queue: str | None = field(
        default=None,
        metadata=option(
            lambda value: check_name("queue", value),
            task_default=True,
            flag=Flag(
                name="--queue", help="Queue (default: the task's own with --app, else 'default')."
            ),
        ),
    )
    priority: int | None = field(
        default=None,
        metadata=option(check_priority, task_default=True, flag=Flag(name="--priority", kind=int)),
    )
    delay: float | timedelta | None = field(
        default=None,
        metadata=option(
            _delay,
            flag=Flag(name="--delay", kind=float, minimum=0, help="Seconds before it is due."),
        ),
    )
    run_at: datetime | None = field(
        default=None,
        metadata=option(
            _run_at,
            flag=Flag(
                name="--run-at",
                kind=datetime,
                help="When it is due: ISO 8601, UTC unless it has an offset.",
            ),
        ),
    )
    retry: RetryPolicy | None = field(
        default=None,
        metadata=option(
            _kind("retry", RetryPolicy),
            task_default=True,
            flag=Flag(
                name="--max-attempts",
                kind=int,
                minimum=1,
                to_value=lambda attempts: RetryPolicy(max_attempts=attempts),
            ),
        ),
    )
    timeout: float | None = field(
        default=None,
        metadata=option(
            _duration("timeout", 0.001),
            task_default=True,
            flag=Flag(
                name="--timeout", kind=float, minimum=0, help="Seconds each attempt may run."
            ),
        ),
    )
    lease: float | None = field(
        default=None,
        metadata=option(
            _duration("lease", MIN_LEASE_SECONDS),
            task_default=True,
            flag=Flag(name="--lease", kind=float, minimum=0, help="Lease seconds of each attempt."),
        ),
    )
    idempotency_key: str | None = field(
        default=None,
        metadata=option(
            check_idempotency_key,
            flag=Flag(
                name="--idempotency-key",
                help="Store at most one task of NAME under this key: repeating the command prints "
                "the first task's id.",
            ),
        ),
    )
    expires: float | timedelta | datetime | None = field(
        default=None,
        metadata=option(
            check_expires,
            task_default=True,
            flag=Flag(
                name="--expires",
                kind=float,
                minimum=0,
                help="Seconds after which it no longer starts: not started by then, it "
                "ends cancelled.",
            ),
        ),
    )
    after: After | None = field(
        default=None,
        metadata=option(
            check_after,
            flag=Flag(
                name="--after",
                help="Task ids (comma-separated) it waits for: it runs once they have succeeded.",
                to_value=parse_after,
            ),
        ),
    )
    on_dependency_failure: AfterPolicy | None = field(
        default=None,
        metadata=option(
            check_after_policy,
            task_default=True,
            flag=Flag(
                name="--on-dependency-failure",
                help="What a dependency that fails or is cancelled does to it: cancel "
                "(the default), fail, or run.",
            ),
        ),
    )
    unique: Unique | None = field(
        default=None, metadata=option(_kind("unique", Unique), task_default=True)
    )
    concurrency: Concurrency | None = field(
        default=None, metadata=option(_kind("concurrency", Concurrency), task_default=True)
    )
    rate: RateLimit | None = field(
        default=None, metadata=option(_kind("rate", RateLimit), task_default=True)
    )

    def __post_init__(self) -> None:
        for one, other in EXCLUSIVE:
            if getattr(self, one) is not None and getattr(self, other) is not None:
                raise ConfigurationError(f"give {one} or {other}, not both")
        for name, spec in OPTIONS:
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, spec.check(value))

    @classmethod
    def of(cls, options: Mapping[str, Any]) -> EnqueueOptions:
        """Options from keywords; an unknown name raises ConfigurationError."""
        unknown = sorted(set(options) - NAMES)
        if unknown:
            raise ConfigurationError(
                f"unknown option{'s' if len(unknown) > 1 else ''}: {', '.join(unknown)} "
                f"(the options are: {', '.join(sorted(NAMES))})"
            )
        return cls(**options)

    def given(self) -> dict[str, Any]:
        """The fields set (not None), by name."""
        return {
            f.name: value
            for f in dataclasses.fields(self)
            if (value := getattr(self, f.name)) is not None
        }

    def merge(self, later: EnqueueOptions) -> EnqueueOptions:
        """These options with ``later``'s set fields on top (``delay`` and
        ``run_at`` replace each other, as ``idempotency_key`` and ``unique`` do)."""
        changes = later.given()
        for pair in EXCLUSIVE:
            if any(name in changes for name in pair):
                for name in pair:
                    changes.setdefault(name, None)
        return dataclasses.replace(self, **changes) if changes else self

    def due(self) -> tuple[datetime | None, float]:
        """(run_at, delay seconds) for a new task."""
        return self.run_at, float(self.delay or 0.0)  # type: ignore[arg-type]

    def refuse(self, *names: str, why: str) -> None:
        """Raise ConfigurationError if any of ``names`` is set."""
        given = [name for name in names if getattr(self, name) is not None]
        if given:
            raise ConfigurationError(f"option {', '.join(given)} cannot be given here: {why}")


OPTIONS: tuple[tuple[str, Spec], ...] = tuple(
    (f.name, f.metadata[SPEC]) for f in dataclasses.fields(EnqueueOptions)
)
"""Every option's name and :class:`Spec`, in declaration order."""
NAMES = frozenset(name for name, _ in OPTIONS)
TASK_DEFAULTS = tuple(name for name, spec in OPTIONS if spec.task_default)
"""The options that a task's defaults hold too, and a call's options override."""


class OptionFields(TypedDict, total=False):
    """The keyword form of :class:`EnqueueOptions` (``**options`` of every
    start): its fields, each without None (``tests/test_options.py`` keeps
    them the same)."""

    queue: str
    priority: int
    delay: float | timedelta
    run_at: datetime
    retry: RetryPolicy
    timeout: float
    lease: float
    idempotency_key: str
    expires: float | timedelta | datetime
    after: After
    on_dependency_failure: AfterPolicy
    unique: Unique
    concurrency: Concurrency
    rate: RateLimit


NO_OPTIONS = EnqueueOptions()


def options_from(options: EnqueueOptions | None, keywords: Mapping[str, Any]) -> EnqueueOptions:
    """``options`` (if any) with the keyword options on top."""
    base = options if options is not None else NO_OPTIONS
    if options is not None and not isinstance(options, EnqueueOptions):
        raise ConfigurationError("options must be a conveyor.EnqueueOptions")
    return base.merge(EnqueueOptions.of(keywords)) if keywords else base


def flow_key(
    concurrency: Concurrency | None,
    rate: RateLimit | None,
    args: Mapping[str, Any],
    task_name: str,
) -> tuple[str | None, int | None, int | None, float | None]:
    """A task's flow-control key, its concurrency limit, and its rate (limit,
    seconds): from ``concurrency`` and ``rate``, which share one key."""
    if concurrency is None and rate is None:
        return None, None, None, None
    key = concurrency.key_for(args) if concurrency is not None else None
    if rate is not None:
        own = rate.key_for(args, task_name) if rate.key is not None or key is None else key
        if key is not None and own != key:
            raise ConfigurationError(
                f"a task has one flow-control key: its concurrency key is {key!r}, "
                f"its rate limit's {own!r} (give RateLimit(key=None) to share it)"
            )
        key = own
    return (
        key,
        concurrency.limit if concurrency is not None else None,
        rate.limit if rate is not None else None,
        rate.seconds if rate is not None else None,
    )
