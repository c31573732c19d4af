"""A registered task: its handler, its default options, and payload binding.

Binding is strict and happens before any I/O: the payload must be a JSON
object whose keys match the handler's parameters (``inspect.Signature.bind``),
and must pass the strict codec. At run time, parameters annotated with a
dataclass or a pydantic model are rebuilt from their JSON form.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

from conveyor import payload as codec
from conveyor.backends.protocol import NewTask
from conveyor.context import TaskContext
from conveyor.errors import ConfigurationError, PayloadError
from conveyor.model import (
    DEFAULT_QUEUE,
    DEFAULT_RETRY,
    MIN_LEASE_SECONDS,
    RetryPolicy,
    check_duration,
)

if TYPE_CHECKING:
    from conveyor.app import App
    from conveyor.handle import TaskHandle

Executor = Literal["async", "thread", "process"]


@dataclass(frozen=True, slots=True)
class TaskOptions:
    """Options of a task; per-enqueue options override the task's."""

    queue: str = DEFAULT_QUEUE
    priority: int = 0
    retry: RetryPolicy = DEFAULT_RETRY
    timeout: float | None = None
    lease: float | None = None

    def __post_init__(self) -> None:
        if not self.queue or not isinstance(self.queue, str):
            raise ConfigurationError("queue must be a non-empty string")
        if not isinstance(self.priority, int) or isinstance(self.priority, bool):
            raise ConfigurationError("priority must be an integer")
        if not -(2**31) <= self.priority < 2**31:
            raise ConfigurationError("priority must fit in 32 bits")
        if not isinstance(self.retry, RetryPolicy):
            raise ConfigurationError("retry must be a conveyor.RetryPolicy")
        check_duration("timeout", self.timeout, minimum=0.001)
        check_duration("lease", self.lease, minimum=MIN_LEASE_SECONDS)

    def merge(self, **overrides: Any) -> TaskOptions:
        changes = {k: v for k, v in overrides.items() if v is not None}
        return dataclasses.replace(self, **changes) if changes else self

    def new_task(
        self, name: str, payload: str, run_at: datetime | None, delay: float, **extra: Any
    ) -> NewTask:
        """A task with these options (``extra``: step, inbox, message...)."""
        return NewTask(
            name=name,
            queue=self.queue,
            payload=payload,
            priority=self.priority,
            max_attempts=self.retry.max_attempts,
            retry=self.retry,
            run_at=run_at,
            delay=delay,
            timeout=self.timeout,
            lease=self.lease,
            **extra,
        )


def step_state(step: Any, max_bytes: int) -> str:
    """Encode a workflow step (a dataclass or pydantic model) as its stored state."""
    plain = codec.to_plain(step)
    if not isinstance(plain, dict):
        raise PayloadError(f"a step must be a dataclass or a pydantic model, not {type(step)!r}")
    return codec.encode(plain, max_bytes)


def run_at_from(
    delay: float | timedelta | None, run_at: datetime | None
) -> tuple[datetime | None, float]:
    """Validate ``delay`` / ``run_at`` (at most one) and return (run_at, delay)."""
    if delay is not None and run_at is not None:
        raise ConfigurationError("give delay or run_at, not both")
    if run_at is not None:
        if run_at.tzinfo is None:
            raise ConfigurationError("run_at must be timezone-aware")
        return run_at, 0.0
    if isinstance(delay, timedelta):
        delay = delay.total_seconds()
    return None, check_duration("delay", delay) or 0.0


class TaskDef:
    """A handler registered on an :class:`~conveyor.App` under a stable name.

    Calling it calls the handler directly (no queue involved). ``enqueue``
    (and ``enqueue_async``) store a task for a worker to run.
    """

    def __init__(
        self,
        app: App,
        fn: Callable[..., Any],
        name: str,
        options: TaskOptions,
        executor: Executor,
    ) -> None:
        self.app = app
        self.fn = fn
        self.name = name
        self.options = options
        self.executor = executor
        self.signature = inspect.signature(fn)
        self._hints = _type_hints(fn)
        self.context_parameter = _context_parameter(self.signature, self._hints)
        self._accepted, self._required, self._open = _keyword_parameters(
            name, self.signature, self.context_parameter
        )
        if executor == "process" and self.context_parameter:
            raise ConfigurationError(f"task {name!r}: process handlers cannot take a TaskContext")
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    def __repr__(self) -> str:
        return f"<TaskDef {self.name} ({self.executor})>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    # -- payloads ----------------------------------------------------------

    def encode_args(self, args: Mapping[str, Any] | None, max_bytes: int) -> str:
        """Check ``args`` against the handler and encode them (no I/O)."""
        plain: dict[str, Any] = {}
        for key, value in (args or {}).items():
            if not isinstance(key, str):
                raise PayloadError(f"argument names must be strings, not {type(key).__name__}")
            plain[key] = codec.to_plain(value)
        self._check_names(plain)
        return codec.encode(plain, max_bytes)

    def _check_names(self, args: Mapping[str, Any]) -> None:
        """The payload's keys must be the handler's keyword parameters."""
        if self.context_parameter and self.context_parameter in args:
            raise PayloadError(f"{self.context_parameter!r} is the handler's context, not data")
        missing = self._required - args.keys() if self._required else None
        if missing:
            raise PayloadError(
                f"payload does not fit task {self.name!r}: "
                f"missing a required argument: {', '.join(sorted(missing))}"
            )
        if not self._open and not self._accepted.issuperset(args):
            unknown = args.keys() - self._accepted
            if unknown:
                raise PayloadError(
                    f"payload does not fit task {self.name!r}: "
                    f"unexpected argument: {', '.join(sorted(unknown))}"
                )

    def build_kwargs(self, args: Mapping[str, Any], ctx: TaskContext | None) -> dict[str, Any]:
        """Handler keyword arguments from a decoded payload (and the context).

        Checks the names again: a stored payload may have been written around
        ``enqueue``. Raises PayloadError if they do not fit the handler.
        """
        self._check_names(args)
        kwargs = {key: _rebuild(self._hints.get(key), value) for key, value in args.items()}
        if self.context_parameter:
            kwargs[self.context_parameter] = ctx
        return kwargs

    # -- enqueue -----------------------------------------------------------

    def new_tasks(
        self,
        many: Iterable[Mapping[str, Any] | None],
        max_bytes: int,
        *,
        keys: Sequence[str | None] | None = None,
        delay: float | timedelta | None = None,
        run_at: datetime | None = None,
        **overrides: Any,
    ) -> list[NewTask]:
        """Checked, encoded tasks for these payloads, all with the same
        options; ``keys``, if given, their idempotency keys in order."""
        options = self.options.merge(**overrides)
        when, seconds = run_at_from(delay, run_at)
        tasks = [
            options.new_task(self.name, self.encode_args(args, max_bytes), when, seconds)
            for args in many
        ]
        if keys is not None:
            for task, key in zip(tasks, keys, strict=True):
                task.idempotency_key = key
        return tasks

    def enqueue(self, **args: Any) -> TaskHandle:
        """Enqueue with the task's default options (sync)."""
        return self.app.enqueue(self, args)

    async def enqueue_async(self, **args: Any) -> TaskHandle:
        """Enqueue with the task's default options (async)."""
        return await self.app.enqueue_async(self, args)


def _type_hints(fn: Callable[..., Any]) -> dict[str, Any]:
    try:
        return typing.get_type_hints(fn)
    except Exception:
        return {}


def _keyword_parameters(
    name: str, signature: inspect.Signature, context: str | None
) -> tuple[frozenset[str], frozenset[str], bool]:
    """(accepted names, required names, takes **kwargs) of a handler's payload."""
    accepted, required, open_ = set(), set(), False
    for parameter in signature.parameters.values():
        if parameter.name == context:
            continue
        if parameter.kind is parameter.VAR_KEYWORD:
            open_ = True
        elif parameter.kind is parameter.VAR_POSITIONAL:
            continue
        elif parameter.kind is parameter.POSITIONAL_ONLY:
            if parameter.default is parameter.empty:
                raise ConfigurationError(
                    f"task {name!r}: positional-only parameter {parameter.name!r} "
                    "cannot be filled from a payload (payloads are keyword arguments)"
                )
        else:
            accepted.add(parameter.name)
            if parameter.default is parameter.empty:
                required.add(parameter.name)
    return frozenset(accepted), frozenset(required), open_


def _context_parameter(signature: inspect.Signature, hints: Mapping[str, Any]) -> str | None:
    for parameter in signature.parameters.values():
        if hints.get(parameter.name) is TaskContext:
            return parameter.name
    return None


def _rebuild(annotation: Any, value: Any) -> Any:
    if not isinstance(annotation, type) or not isinstance(value, dict):
        return value
    validate = getattr(annotation, "model_validate", None)
    if callable(validate):
        return validate(value)
    if dataclasses.is_dataclass(annotation):
        return annotation(**value)
    return value
