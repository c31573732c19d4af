"""A registered task: its handler, its default options, and payload binding.

Binding is strict and happens before any I/O: the payload must be a JSON
object whose keys match the handler's keyword parameters, its values must
fit the handler's type hints (with the ``pydantic`` extra installed; see
:mod:`conveyor.typed`), and it must pass the strict codec. At run time the
arguments are rebuilt as declared (a ``datetime`` from its ISO string, a
dataclass from its object), and a declared return type is checked when the
worker stores the result and rebuilt by the handle's ``result()``.

A definition is generic in its handler's parameters and return type:
``add.enqueue(a=1, b=2)`` is a ``TaskHandle[int]`` for a handler
``async def add(a: int, b: int) -> int``. A context parameter is left out of
the enqueue signature when it comes first (``def f(ctx: TaskContext, ...)``).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import (
    TYPE_CHECKING,
    Any,
    ClassVar,
    Concatenate,
    Generic,
    Literal,
    Protocol,
    Unpack,
    overload,
)

from conveyor import payload as codec
from conveyor import typed
from conveyor.backends.params import NewTask
from conveyor.client import Client
from conveyor.context import TaskContext
from conveyor.errors import ConfigurationError, PayloadError
from conveyor.handle import TaskHandle
from conveyor.hints import declared_types
from conveyor.model import (
    DEFAULT_QUEUE,
    DEFAULT_RETRY,
    RetryPolicy,
    batch_keys,
    check_name,
)
from conveyor.options import (
    NO_OPTIONS,
    OPTIONS,
    TASK_DEFAULTS,
    AfterPolicy,
    Concurrency,
    EnqueueOptions,
    OptionFields,
    RateLimit,
    Unique,
    check_after,
    expiry,
    flow_key,
    options_from,
)
from conveyor.signature import Signature

if TYPE_CHECKING:
    # Defaults (PEP 696) make a bare ``TaskDef`` mean ``TaskDef[..., Any]``;
    # Python 3.11's typing has no defaults, so they exist for type checkers only.
    from typing_extensions import ParamSpec, TypeVar

    P = ParamSpec("P", default=...)
    R = TypeVar("R", default=Any)
else:
    from typing import ParamSpec, TypeVar

    P = ParamSpec("P")
    R = TypeVar("R")

Executor = Literal["async", "thread", "process"]


class TaskDecorator(Protocol):
    """What ``@app.task(...)`` returns: it registers a handler and gives its
    definition, typed by the handler (see :meth:`conveyor.App.task`)."""

    @overload
    def __call__(
        self, fn: Callable[Concatenate[TaskContext, P], Awaitable[R]], /
    ) -> TaskDef[P, R]: ...

    @overload
    def __call__(self, fn: Callable[P, Awaitable[R]], /) -> TaskDef[P, R]: ...

    @overload
    def __call__(self, fn: Callable[Concatenate[TaskContext, P], R], /) -> TaskDef[P, R]: ...

    @overload
    def __call__(self, fn: Callable[P, R], /) -> TaskDef[P, R]: ...


@dataclass(frozen=True, slots=True)
class TaskOptions:
    """A task's defaults; the options of one call (:class:`EnqueueOptions`)
    override them field by field. Its fields are the options declared with
    ``task_default`` (:data:`conveyor.options.TASK_DEFAULTS`; a test keeps
    them the same)."""

    queue: str = DEFAULT_QUEUE
    priority: int = 0
    retry: RetryPolicy = DEFAULT_RETRY
    timeout: float | None = None
    lease: float | None = None
    expires: float | timedelta | datetime | None = None
    on_dependency_failure: AfterPolicy | None = None
    unique: Unique | None = None
    concurrency: Concurrency | None = None
    rate: RateLimit | None = None

    def __post_init__(self) -> None:
        # Each default is checked as the option it is (conveyor.options.OPTIONS);
        # one that may not be None (queue, priority, retry) is checked even then.
        specs = dict(OPTIONS)
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is not None or f.default is not None:
                object.__setattr__(self, f.name, specs[f.name].check(value))

    def apply(self, options: EnqueueOptions) -> TaskOptions:
        """These defaults with the options of one call on top."""
        changes = {
            name: value for name in TASK_DEFAULTS if (value := getattr(options, name)) is not None
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
            expires_at=expiry(self.expires, run_at, delay),
            **extra,
        )

    def add_dependencies(self, task: NewTask, options: EnqueueOptions) -> None:
        """Give ``task`` the dependencies of one call (``after``) and this
        task's policy for one that fails."""
        if options.after:
            task.after = check_after(options.after)  # the normal form: ids
            task.after_policy = self.on_dependency_failure or "cancel"


def check_received(task: str, parameter: str | None, args: Mapping[str, Any]) -> None:
    """A parameter a task receives from its dependencies is not given at enqueue."""
    if parameter is not None and parameter in args:
        raise PayloadError(
            f"task {task!r} receives {parameter!r} from its dependencies: do not give it"
        )


def unique_task(task: NewTask, unique: Unique, args: Mapping[str, Any]) -> None:
    """Give ``task`` its unique key (from ``args``), scope and conflict rule."""
    task.idempotency_key = unique.key_for(args, task.payload)
    task.unique_scope = unique.state_scope
    task.unique_for = unique.period
    task.on_conflict = unique.on_conflict


def step_state(step: Any, max_bytes: int) -> str:
    """Encode a workflow step (a dataclass or pydantic model) as its stored
    state: with pydantic, its fields checked against their types and
    converted as a task's arguments are (see :mod:`conveyor.typed`)."""
    kind = typed.step_type(type(step)) if _is_record(type(step)) else None
    plain = codec.to_plain(step) if kind is None else kind.to_json(step, "the step")
    if not isinstance(plain, dict):
        raise PayloadError(f"a step must be a dataclass or a pydantic model, not {type(step)!r}")
    return codec.encode(plain, max_bytes)


def step_from_state(cls: type, state: Any) -> Any:
    """Rebuild a workflow step from its stored state (PayloadError, or the
    class's own error, if it no longer fits)."""
    if not isinstance(state, dict):
        raise TypeError("the stored state is not a JSON object")
    kind = typed.step_type(cls) if _is_record(cls) else None
    if kind is not None:
        return kind.from_json(state, "the stored state")
    validate = getattr(cls, "model_validate", None)
    if callable(validate):
        return validate(state)
    return cls(**state)


def _is_record(cls: type) -> bool:
    return dataclasses.is_dataclass(cls) or callable(getattr(cls, "model_validate", None))


def run_at_from(
    delay: float | timedelta | None, run_at: datetime | None
) -> tuple[datetime | None, float]:
    """Validate ``delay`` / ``run_at`` (at most one) and return (run_at, delay)."""
    return EnqueueOptions(delay=delay, run_at=run_at).due()


class TaskDef(Generic[P, R]):
    """A handler registered on an :class:`~conveyor.App` under a stable name.

    Calling it calls the handler directly, in the caller's thread, for unit
    tests: no queue, worker, lease, retry or payload check is involved; the
    arguments go to the handler as given, and a ``TaskContext`` parameter
    takes one the caller builds. An ``async def`` handler returns its
    coroutine, to await. A workflow is not called (TypeError): start it,
    or call a step's ``run``.

    ``enqueue`` (and ``enqueue_async``) store a task for a worker to run,
    with the task's defaults; ``options(...)`` gives the options of one call::

        send_email.enqueue(to="a@example.com")
        send_email.options(delay=60, queue="mail").enqueue(to="a@example.com")

    ``defaults`` holds the options given at registration. The handler's
    type hints are read once, here (see :mod:`conveyor.typed`): a type
    pydantic cannot validate raises ConfigurationError.
    """

    payload_from_signature: ClassVar[bool] = True
    """False for the kinds whose payload is a state rather than the handler's
    arguments (workflows and coroutines): their types are not read."""

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
        self.name = check_name("a task name", name)
        self.defaults = defaults
        self.executor = executor
        self.signature = inspect.signature(fn)
        self._hints = declared_types(fn)
        self.context_parameter = _context_parameter(self.signature, self._hints)
        self._accepted, self._required, self._open = _keyword_parameters(
            name, self.signature, self.context_parameter
        )
        self._positional = _positional_names(self.signature, self.context_parameter)
        if executor == "process" and self.context_parameter:
            raise ConfigurationError(f"task {name!r}: process handlers cannot take a TaskContext")
        hints = self._hints if self.payload_from_signature else {}
        self._payload = typed.payload_types(f"task {name!r}", hints, self._accepted)
        self._result = typed.ResultType(hints, f"task {name!r}")
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    def __repr__(self) -> str:
        return f"<TaskDef {self.name} ({self.executor})>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if getattr(self.fn, "__self__", None) is self:  # a workflow's own runner
            raise TypeError(
                f"{self!r} is not called directly: start it and run it with a worker "
                "(conveyor.testing.drain in a test), or call one step's run(ctx)"
            )
        return self.fn(*args, **kwargs)

    # -- payloads ----------------------------------------------------------

    def encode_args(
        self, args: Mapping[str, Any] | None, max_bytes: int, receives: str | None = None
    ) -> str:
        """Check ``args`` against the handler (names, then types) and encode
        them in their JSON form (no I/O); ``receives``, a parameter filled
        from the task's dependencies when it runs, is not among them. Raises
        PayloadError naming the argument, or PayloadTooLargeError."""
        given: dict[str, Any] = args if type(args) is dict else dict(args or {})
        for key in given:
            if type(key) is not str:
                raise PayloadError(f"argument names must be strings, not {type(key).__name__}")
        check_received(self.name, receives, given)
        self._check_names(given, receives)
        return codec.encode(self._payload.to_json(given), max_bytes)

    def _check_names(self, args: Mapping[str, Any], received: str | None = None) -> None:
        """The payload's keys must be the handler's keyword parameters (but
        ``received``, filled when the task runs)."""
        if self.context_parameter and self.context_parameter in args:
            raise PayloadError(f"{self.context_parameter!r} is the handler's context, not data")
        missing = self._required - args.keys() - {received} if self._required else None
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
        kwargs = self._payload.from_json(dict(args))  # a copy: ctx.payload stays as stored
        if self.context_parameter:
            kwargs[self.context_parameter] = ctx
        return kwargs

    def encode_result(self, value: Any, max_bytes: int) -> str:
        """The handler's return value as stored: checked against its declared
        return type and converted to its JSON form (with pydantic), then
        encoded by the strict codec. Raises PayloadError."""
        return codec.encode(self._result.to_json(value), max_bytes)

    def rebuild_result(self, value: Any) -> R:
        """A stored result rebuilt into the handler's declared return type (as
        decoded, when it declares none or pydantic is not installed). Raises
        PayloadError if it no longer fits."""
        rebuilt: R = self._result.from_json(value)
        return rebuilt

    def typed_handles(self, handles: list[TaskHandle[Any]]) -> list[TaskHandle[R]]:
        """Handles whose ``result()`` rebuilds the declared return type."""
        if not self._result.rebuilds:
            return handles
        rebuild = self.rebuild_result
        return [TaskHandle(handle.client, handle.id, rebuild) for handle in handles]

    def _bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """The payload of ``enqueue(*args, **kwargs)``: positional arguments
        named after the handler's parameters."""
        if not args:
            return kwargs
        if len(args) > len(self._positional):
            raise PayloadError(
                f"payload does not fit task {self.name!r}: it takes at most "
                f"{len(self._positional)} positional argument(s), {len(args)} given"
            )
        named = dict(zip(self._positional, args, strict=False))
        twice = named.keys() & kwargs.keys()
        if twice:
            raise PayloadError(
                f"payload does not fit task {self.name!r}: "
                f"more than one value for {', '.join(sorted(twice))}"
            )
        return {**named, **kwargs}

    # -- enqueue -----------------------------------------------------------

    def new_tasks(
        self,
        many: Iterable[Mapping[str, Any] | None],
        options: EnqueueOptions = NO_OPTIONS,
        keys: Sequence[str | None] | None = None,
        receives: str | None = None,
    ) -> list[NewTask]:
        """Checked, encoded tasks for these payloads, all with the same
        options; ``keys``, if given, their idempotency keys in order (else
        each gets ``options.idempotency_key``: give it for one task only).
        ``receives`` is the parameter the tasks receive from their
        dependencies when they run (not given now: see
        :mod:`conveyor.dependencies`)."""
        defaults = self.defaults.apply(options)
        when, seconds = options.due()
        max_bytes = self.client.max_payload_bytes
        key = options.idempotency_key
        unique = None if key is not None else defaults.unique
        tasks = []
        for args in many:
            payload = self.encode_args(args, max_bytes, receives)
            task = defaults.new_task(self.name, payload, when, seconds, idempotency_key=key)
            defaults.add_dependencies(task, options)
            if unique is not None:
                unique_task(task, unique, args or {})
            if defaults.concurrency is not None or defaults.rate is not None:
                (
                    task.concurrency_key,
                    task.concurrency_limit,
                    task.rate_limit,
                    task.rate_period,
                ) = flow_key(defaults.concurrency, defaults.rate, args or {}, self.name)
            tasks.append(task)
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
    ) -> list[TaskHandle[R]]:
        """Check, encode and store tasks of this kind, all or none; handles in
        order. With ``batch``, task *i* gets the idempotency key
        ``{key}#{i}`` (see :meth:`conveyor.App.enqueue_many`)."""
        return self.typed_handles(
            self.client.enqueue_encoded(
                self._encoder(payloads, options, batch), len(payloads), connection
            )
        )

    async def store_async(
        self,
        payloads: Sequence[Mapping[str, Any] | None],
        options: EnqueueOptions = NO_OPTIONS,
        connection: Any = None,
        *,
        batch: bool = False,
    ) -> list[TaskHandle[R]]:
        """Async form of :meth:`store`."""
        return self.typed_handles(
            await self.client.enqueue_encoded_async(
                self._encoder(payloads, options, batch), len(payloads), connection
            )
        )

    def _encoder(
        self, payloads: Sequence[Mapping[str, Any] | None], options: EnqueueOptions, batch: bool
    ) -> Callable[[int, int], list[NewTask]]:
        batched = batch and options.idempotency_key is not None
        keys = batch_keys(options.idempotency_key, len(payloads)) if batched else None

        def encode(start: int, end: int) -> list[NewTask]:
            part = keys[start:end] if keys is not None else None
            return self.new_tasks(payloads[start:end], options, part)

        return encode

    def accepts(self, parameter: str) -> bool:
        """Whether the handler takes ``parameter`` from a payload."""
        return parameter in self._accepted or (self._open and parameter != self.context_parameter)

    def s(self, *args: P.args, **kwargs: P.kwargs) -> Signature[R]:
        """This task with these arguments, to store later: a link of a chain,
        a member of a group, a chord's callback (see
        :mod:`conveyor.composition`). The arguments are checked now."""
        return Signature(self, self._bind(args, kwargs))

    def options(
        self, *, connection: Any = None, **options: Unpack[OptionFields]
    ) -> BoundTask[P, R]:
        """This task with the options of one call (see :class:`EnqueueOptions`),
        checked now; ``connection`` enqueues inside the caller's transaction
        (see :meth:`conveyor.App.enqueue`). Raises ConfigurationError for an
        option that is not one, naming the valid ones."""
        return BoundTask(self, EnqueueOptions.of(options), connection)

    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> TaskHandle[R]:
        """Enqueue with the task's default options (sync); its handle once
        durable. Arguments as for the handler (positional ones are named
        after its parameters), checked before any I/O: PayloadError."""
        return self.store([self._bind(args, kwargs)])[0]

    async def enqueue_async(self, *args: P.args, **kwargs: P.kwargs) -> TaskHandle[R]:
        """Async form of :meth:`enqueue`."""
        return (await self.store_async([self._bind(args, kwargs)]))[0]


class BoundTask(Generic[P, R]):
    """A task with the options of one call: ``task.options(...)``. Its
    ``enqueue`` methods take the payload only."""

    __slots__ = ("connection", "enqueue_options", "task")

    def __init__(
        self, task: TaskDef[P, R], options: EnqueueOptions, connection: Any = None
    ) -> None:
        self.task = task
        self.enqueue_options = options
        self.connection = connection

    def __repr__(self) -> str:
        return f"<BoundTask {self.task.name} {self.enqueue_options.given()}>"

    def options(
        self, *, connection: Any = None, **options: Unpack[OptionFields]
    ) -> BoundTask[P, R]:
        """These options with more on top."""
        merged = options_from(self.enqueue_options, options)
        return BoundTask(self.task, merged, connection or self.connection)

    def s(self, *args: P.args, **kwargs: P.kwargs) -> Signature[R]:
        """This task with these arguments and options, to store later (see
        :meth:`TaskDef.s`)."""
        return Signature(self.task, self.task._bind(args, kwargs), self.enqueue_options)

    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> TaskHandle[R]:
        """Store one task with these options; its handle once durable."""
        payload = self.task._bind(args, kwargs)
        return self.task.store([payload], self.enqueue_options, self.connection)[0]

    async def enqueue_async(self, *args: P.args, **kwargs: P.kwargs) -> TaskHandle[R]:
        """Async form of :meth:`enqueue`."""
        payload = self.task._bind(args, kwargs)
        return (await self.task.store_async([payload], self.enqueue_options, self.connection))[0]

    def enqueue_many(self, many: Iterable[Mapping[str, Any] | None]) -> list[TaskHandle[R]]:
        """Store many tasks with these options, all or none (see
        :meth:`conveyor.App.enqueue_many`)."""
        return self.task.store(list(many), self.enqueue_options, self.connection, batch=True)

    async def enqueue_many_async(
        self, many: Iterable[Mapping[str, Any] | None]
    ) -> list[TaskHandle[R]]:
        """Async form of :meth:`enqueue_many`."""
        return await self.task.store_async(
            list(many), self.enqueue_options, self.connection, batch=True
        )


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


def _positional_names(signature: inspect.Signature, context: str | None) -> tuple[str, ...]:
    """The parameters ``enqueue``'s positional arguments fill, in order."""
    return tuple(
        parameter.name
        for parameter in signature.parameters.values()
        if parameter.kind is parameter.POSITIONAL_OR_KEYWORD and parameter.name != context
    )


def _context_parameter(signature: inspect.Signature, hints: Mapping[str, Any]) -> str | None:
    for parameter in signature.parameters.values():
        if hints.get(parameter.name) is TaskContext:
            return parameter.name
    return None
