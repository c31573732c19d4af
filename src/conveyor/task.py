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
from typing import TYPE_CHECKING, Any, Literal, Unpack

from conveyor import payload as codec
from conveyor.backends.protocol import NewTask
from conveyor.client import Client
from conveyor.context import TaskContext
from conveyor.errors import ConfigurationError, PayloadError
from conveyor.model import (
    DEFAULT_QUEUE,
    DEFAULT_RETRY,
    MIN_LEASE_SECONDS,
    RetryPolicy,
    batch_keys,
    check_duration,
)
from conveyor.options import (
    NO_OPTIONS,
    EnqueueOptions,
    OptionFields,
    check_priority,
    options_from,
)

if TYPE_CHECKING:
    from conveyor.handle import TaskHandle

Executor = Literal["async", "thread", "process"]


@dataclass(frozen=True, slots=True)
class TaskOptions:
    """A task's defaults; the options of one call (:class:`EnqueueOptions`)
    override them field by field."""

    queue: str = DEFAULT_QUEUE
    priority: int = 0
    retry: RetryPolicy = DEFAULT_RETRY
    timeout: float | None = None
    lease: float | None = None

    def __post_init__(self) -> None:
        if not self.queue or not isinstance(self.queue, str):
            raise ConfigurationError("queue must be a non-empty string")
        check_priority(self.priority)
        if not isinstance(self.retry, RetryPolicy):
            raise ConfigurationError("retry must be a conveyor.RetryPolicy")
        check_duration("timeout", self.timeout, minimum=0.001)
        check_duration("lease", self.lease, minimum=MIN_LEASE_SECONDS)

    def apply(self, options: EnqueueOptions) -> TaskOptions:
        """These defaults with the options of one call on top."""
        changes = {
            name: value
            for name in ("queue", "priority", "retry", "timeout", "lease")
            if (value := getattr(options, name)) is not None
        }
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
    return EnqueueOptions(delay=delay, run_at=run_at).due()


class TaskDef:
    """A handler registered on an :class:`~conveyor.App` under a stable name.

    Calling it calls the handler directly (no queue involved). ``enqueue``
    (and ``enqueue_async``) store a task for a worker to run, with the
    task's defaults; ``options(...)`` gives the options of one call::

        send_email.enqueue(to="a@example.com")
        send_email.options(delay=60, queue="mail").enqueue(to="a@example.com")

    ``defaults`` holds the options given at registration.
    """

    def __init__(
        self,
        client: Client,
        fn: Callable[..., Any],
        name: str,
        defaults: TaskOptions,
        executor: Executor,
    ) -> None:
        self.client = client
        self.fn = fn
        self.name = name
        self.defaults = defaults
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
        options: EnqueueOptions = NO_OPTIONS,
        keys: Sequence[str | None] | None = None,
    ) -> list[NewTask]:
        """Checked, encoded tasks for these payloads, all with the same
        options; ``keys``, if given, their idempotency keys in order (else
        each gets ``options.idempotency_key``: give it for one task only)."""
        defaults = self.defaults.apply(options)
        when, seconds = options.due()
        max_bytes = self.client.max_payload_bytes
        key = options.idempotency_key
        tasks = [
            defaults.new_task(
                self.name, self.encode_args(args, max_bytes), when, seconds, idempotency_key=key
            )
            for args in many
        ]
        if keys is not None:
            for task, each in zip(tasks, keys, strict=True):
                task.idempotency_key = each
        return tasks

    def store(
        self,
        payloads: Sequence[Mapping[str, Any] | None],
        options: EnqueueOptions = NO_OPTIONS,
        connection: Any = None,
        *,
        batch: bool = False,
    ) -> list[TaskHandle]:
        """Check, encode and store tasks of this kind, all or none; handles in
        order. With ``batch``, task *i* gets the idempotency key
        ``{key}#{i}`` (see :meth:`conveyor.App.enqueue_many`)."""
        return self.client.enqueue_encoded(
            self._encoder(payloads, options, batch), len(payloads), connection
        )

    async def store_async(
        self,
        payloads: Sequence[Mapping[str, Any] | None],
        options: EnqueueOptions = NO_OPTIONS,
        connection: Any = None,
        *,
        batch: bool = False,
    ) -> list[TaskHandle]:
        """Async form of :meth:`store`."""
        return await self.client.enqueue_encoded_async(
            self._encoder(payloads, options, batch), len(payloads), connection
        )

    def _encoder(
        self, payloads: Sequence[Mapping[str, Any] | None], options: EnqueueOptions, batch: bool
    ) -> Callable[[int, int], list[NewTask]]:
        keys = batch_keys(options.idempotency_key, len(payloads)) if batch else None

        def encode(start: int, end: int) -> list[NewTask]:
            part = keys[start:end] if keys is not None else None
            return self.new_tasks(payloads[start:end], options, part)

        return encode

    def options(self, *, connection: Any = None, **options: Unpack[OptionFields]) -> BoundTask:
        """This task with the options of one call (see :class:`EnqueueOptions`),
        checked now; ``connection`` enqueues inside the caller's transaction
        (see :meth:`conveyor.App.enqueue`). Raises ConfigurationError for an
        option that is not one, naming the valid ones."""
        return BoundTask(self, EnqueueOptions.of(options), connection)

    def enqueue(self, **args: Any) -> TaskHandle:
        """Enqueue with the task's default options (sync); its handle once durable."""
        return self.store([args])[0]

    async def enqueue_async(self, **args: Any) -> TaskHandle:
        """Enqueue with the task's default options (async)."""
        return (await self.store_async([args]))[0]


class BoundTask:
    """A task with the options of one call: ``task.options(...)``. Its
    ``enqueue`` methods take the payload only."""

    __slots__ = ("connection", "enqueue_options", "task")

    def __init__(self, task: TaskDef, options: EnqueueOptions, connection: Any = None) -> None:
        self.task = task
        self.enqueue_options = options
        self.connection = connection

    def __repr__(self) -> str:
        return f"<BoundTask {self.task.name} {self.enqueue_options.given()}>"

    def options(self, *, connection: Any = None, **options: Unpack[OptionFields]) -> BoundTask:
        """These options with more on top."""
        merged = options_from(self.enqueue_options, options)
        return BoundTask(self.task, merged, connection or self.connection)

    def enqueue(self, **args: Any) -> TaskHandle:
        """Store one task with these options; its handle once durable."""
        return self.task.store([args], self.enqueue_options, self.connection)[0]

    async def enqueue_async(self, **args: Any) -> TaskHandle:
        """Async form of :meth:`enqueue`."""
        return (await self.task.store_async([args], self.enqueue_options, self.connection))[0]

    def enqueue_many(self, many: Iterable[Mapping[str, Any] | None]) -> list[TaskHandle]:
        """Store many tasks with these options, all or none (see
        :meth:`conveyor.App.enqueue_many`)."""
        return self.task.store(list(many), self.enqueue_options, self.connection, batch=True)

    async def enqueue_many_async(
        self, many: Iterable[Mapping[str, Any] | None]
    ) -> list[TaskHandle]:
        """Async form of :meth:`enqueue_many`."""
        return await self.task.store_async(
            list(many), self.enqueue_options, self.connection, batch=True
        )


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
