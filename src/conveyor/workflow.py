"""Step workflows: a task that runs as a chain of typed steps.

A workflow is registered on an App under a stable name; its steps are
dataclasses (or pydantic models) registered on it under stable names, each
with an ``async def run(self, ctx)`` that returns :func:`done` or
:func:`next`::

    orders = app.workflow("order")

    @orders.step(retry=RetryPolicy(max_attempts=5))
    @dataclass
    class Charge:
        order_id: int
        async def run(self, ctx: TaskContext) -> Done | Next:
            await charge_card(self.order_id)
            return conveyor.next(Ship(self.order_id), delay=60)

    orders.start(Charge(order_id=7))

Guarantees: a step's state is stored as JSON. Moving to the next step (its
state, its run time, its options) is one fenced write that also closes the
attempt, so it happens once or not at all: a worker that lost its lease
changes nothing, and a step whose transition committed never runs again. On
PostgreSQL, writes made through ``ctx.transaction()`` commit in that same
transaction. A step runs at least once: after a crash it runs again, from
its stored state. Each step has its own retry policy, timeout and lease, and
its own attempt budget (the lease token, ``ctx.attempt``, keeps growing);
each attempt row records its step. While a delayed next step waits, the task
is ``pending`` with a future ``run_at`` and holds no lease.

A step whose stored state no longer decodes (the code changed), or a step
name this worker does not know, fails the task at once with
:class:`StepError`, keeping the stored state; ``conveyor retry ID`` resumes
it from that step once the code is fixed.

Limits: ``run`` must be ``async def`` (a plain ``def`` step would be a
thread the worker cannot stop); step names are part of the stored data, so
renaming a step class needs its old ``name=``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar, Unpack, overload

from conveyor import payload as codec
from conveyor.backends.params import ClaimedTask, Completion, NewTask, Transition
from conveyor.context import TaskContext
from conveyor.errors import ConfigurationError, DuplicateTaskError, Fatal
from conveyor.model import DEFAULT_RETRY, Outcome, RetryPolicy, TaskState
from conveyor.options import NO_OPTIONS, EnqueueOptions, OptionFields, options_from
from conveyor.task import TaskDef, TaskOptions, run_at_from, step_from_state, step_state

if TYPE_CHECKING:
    from conveyor.client import Client
    from conveyor.handle import TaskHandle

S = TypeVar("S", bound=type)


class StepError(Fatal):
    """A step cannot run as stored: its state no longer decodes, its name is
    unknown, or ``run`` returned something other than ``done``/``next``.
    Not retried; the stored state is kept for ``conveyor retry``."""


@dataclass(frozen=True, slots=True)
class Done:
    """The workflow ends ``succeeded`` with ``result`` (strict JSON)."""

    result: Any = None


@dataclass(frozen=True, slots=True)
class Next:
    """The workflow moves to ``step`` (an instance of a registered step class)."""

    step: Any
    run_at: datetime | None = None
    delay: float = 0.0


def done(result: Any = None) -> Done:
    """End the workflow with ``result``."""
    return Done(result)


def next(step: Any, *, delay: float | timedelta | None = None, at: datetime | None = None) -> Next:
    """Move to ``step`` now, after ``delay`` seconds, or at ``at`` (aware datetime)."""
    when, seconds = run_at_from(delay, at)
    return Next(step, when, seconds)


@dataclass(frozen=True, slots=True)
class StepDef:
    name: str
    cls: type
    options: TaskOptions


class Workflow(TaskDef):
    """A step workflow registered on an App (see the module docstring)."""

    payload_from_signature = False

    def __init__(self, client: Client, name: str, defaults: TaskOptions) -> None:
        super().__init__(client, self._run, name, defaults, "async")
        self.steps: dict[str, StepDef] = {}
        self._by_class: dict[type, StepDef] = {}

    def __repr__(self) -> str:
        return f"<Workflow {self.name} ({len(self.steps)} steps)>"

    @overload
    def step(self, cls: S, /) -> S: ...

    @overload
    def step(
        self,
        cls: None = None,
        /,
        *,
        name: str | None = None,
        retry: RetryPolicy = DEFAULT_RETRY,
        timeout: float | None = None,
        lease: float | None = None,
    ) -> Callable[[S], S]: ...

    def step(
        self,
        cls: S | None = None,
        /,
        *,
        name: str | None = None,
        retry: RetryPolicy = DEFAULT_RETRY,
        timeout: float | None = None,
        lease: float | None = None,
    ) -> S | Callable[[S], S]:
        """Register a step class (a dataclass or a pydantic model with an
        ``async def run(self, ctx)``) under ``name`` (default: its class name)."""
        options = TaskOptions(
            queue=self.defaults.queue,
            priority=self.defaults.priority,
            retry=retry,
            timeout=timeout,
            lease=lease,
        )

        def register(step_cls: S) -> S:
            step_name = name or step_cls.__name__
            if step_name in self.steps:
                raise DuplicateTaskError(f"workflow {self.name!r} already has a step {step_name!r}")
            run = getattr(step_cls, "run", None)
            if not asyncio.iscoroutinefunction(run):
                raise ConfigurationError(
                    f"step {step_name!r} needs an `async def run(self, ctx)` method"
                )
            found = StepDef(step_name, step_cls, options)
            self.steps[step_name] = found
            self._by_class[step_cls] = found
            return step_cls

        return register(cls) if cls is not None else register

    # -- starting ------------------------------------------------------------

    def _definition_of(self, step: Any) -> StepDef:
        found = self._by_class.get(type(step))
        if found is None:
            raise ConfigurationError(
                f"{type(step).__name__} is not a step of workflow {self.name!r}"
            )
        return found

    def new_workflow(self, step: Any, options: EnqueueOptions = NO_OPTIONS) -> NewTask:
        """The task that starts this workflow at ``step`` (checked, no I/O).
        Per call: ``queue``, ``priority``, ``delay`` or ``run_at``,
        ``idempotency_key``; a step's retry, timeout and lease are its own."""
        options.refuse("retry", "timeout", "lease", why="a workflow's come from its steps")
        definition = self._definition_of(step)
        when, seconds = options.due()
        payload = step_state(step, self.client.max_payload_bytes)
        defaults = definition.options.apply(options)
        task = defaults.new_task(
            self.name,
            payload,
            when,
            seconds,
            step=definition.name,
            idempotency_key=options.idempotency_key,
        )
        defaults.add_dependencies(task, options)
        return task

    def start(
        self, step: Any, *, connection: Any = None, **options: Unpack[OptionFields]
    ) -> TaskHandle:
        """Store a new workflow that begins at ``step``; its handle once durable.

        Options (see :class:`EnqueueOptions`): ``queue``, ``priority``,
        ``delay`` or ``run_at``, ``idempotency_key`` (a start with a key
        already used for this workflow returns the stored workflow);
        ``connection`` as for :meth:`App.enqueue`."""
        return self.options(connection=connection, **options).start(step)

    async def start_async(
        self, step: Any, *, connection: Any = None, **options: Unpack[OptionFields]
    ) -> TaskHandle:
        """Async form of :meth:`start`."""
        return await self.options(connection=connection, **options).start_async(step)

    def options(  # type: ignore[override]
        self, *, connection: Any = None, **options: Unpack[OptionFields]
    ) -> BoundWorkflow:
        """This workflow with the options of one start, checked now."""
        return BoundWorkflow(self, EnqueueOptions.of(options), connection)

    # -- running -------------------------------------------------------------

    def build_kwargs(self, args: Any, ctx: TaskContext | None) -> dict[str, Any]:
        """The arguments of one step's run for the worker: the context and the
        step's stored state."""
        return {"ctx": ctx, "state": args}

    async def _run(self, ctx: TaskContext, state: dict[str, Any]) -> Done | Next:
        definition = self.steps.get(ctx.step or "")
        if definition is None:
            raise StepError(
                f"workflow {self.name!r} has no step {ctx.step!r} on this worker "
                f"(known: {', '.join(sorted(self.steps)) or 'none'})"
            )
        try:
            instance = step_from_state(definition.cls, state)
        except Exception as exc:
            raise StepError(
                f"the stored state of step {definition.name!r} no longer decodes: {exc}"
            ) from exc
        outcome = await instance.run(ctx)
        if not isinstance(outcome, Done | Next):
            raise StepError(
                f"step {definition.name!r} returned {type(outcome).__name__}; "
                "return conveyor.done(...) or conveyor.next(...)"
            )
        return outcome

    def completion(self, task: ClaimedTask, outcome: Done | Next, max_bytes: int) -> Completion:
        """How a step's outcome is recorded: the end, or a transition."""
        if isinstance(outcome, Done):
            result = codec.encode(codec.to_plain(outcome.result), max_bytes)
            return Completion(task.token, Outcome.SUCCEEDED, TaskState.SUCCEEDED, result=result)
        definition = self._definition_of(outcome.step)
        options = definition.options
        transition = Transition(
            step=definition.name,
            state=step_state(outcome.step, max_bytes),
            max_attempts=options.retry.max_attempts,
            retry=options.retry,
            timeout=options.timeout,
            lease=options.lease,
            run_at=outcome.run_at,
            delay=outcome.delay,
        )
        return Completion(task.token, Outcome.SUCCEEDED, TaskState.PENDING, transition=transition)


class BoundWorkflow:
    """A workflow with the options of one start: ``workflow.options(...)``."""

    __slots__ = ("connection", "enqueue_options", "workflow")

    def __init__(self, workflow: Workflow, options: EnqueueOptions, connection: Any) -> None:
        options.refuse("retry", "timeout", "lease", why="a workflow's come from its steps")
        self.workflow = workflow
        self.enqueue_options = options
        self.connection = connection

    def options(self, *, connection: Any = None, **options: Unpack[OptionFields]) -> BoundWorkflow:
        """These options with more on top."""
        merged = options_from(self.enqueue_options, options)
        return BoundWorkflow(self.workflow, merged, connection or self.connection)

    def start(self, step: Any) -> TaskHandle:
        """Store a new workflow that begins at ``step``; its handle once durable."""
        new = [self.workflow.new_workflow(step, self.enqueue_options)]
        return self.workflow.client.enqueue_new(new, self.connection)[0]

    async def start_async(self, step: Any) -> TaskHandle:
        """Async form of :meth:`start`."""
        new = [self.workflow.new_workflow(step, self.enqueue_options)]
        return (await self.workflow.client.enqueue_new_async(new, self.connection))[0]
