"""A task with its arguments and options, not stored yet: a link of a
chain, a member of a group, a chord's callback (see :mod:`conveyor.composition`).

``send_email.s(to="a@example.com")`` builds one; ``.options(...)`` adds the
options of one call, ``.receiving("param")`` names the parameter that gets
what its dependencies ended with when it runs (see
:mod:`conveyor.dependencies`). Its arguments are checked as an enqueue
checks them (PayloadError) when its task is made (``new_task``): before
anything of a chain, group or chord is stored.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Generic, Protocol, TypeVar, Unpack

from conveyor.backends.params import NewTask
from conveyor.client import Client
from conveyor.dependencies import ReceiveKind, receives_text
from conveyor.errors import ConfigurationError
from conveyor.handle import TaskHandle
from conveyor.options import NO_OPTIONS, After, EnqueueOptions, OptionFields, options_from

R = TypeVar("R")


class Definition(Protocol[R]):
    """What a signature needs of its task (a :class:`conveyor.task.TaskDef`)."""

    name: str
    client: Client

    def new_tasks(
        self,
        many: Iterable[Mapping[str, Any] | None],
        options: EnqueueOptions = ...,
        keys: Sequence[str | None] | None = ...,
        receives: str | None = ...,
    ) -> list[NewTask]: ...

    def accepts(self, parameter: str) -> bool: ...

    def typed_handles(self, handles: list[TaskHandle[Any]]) -> list[TaskHandle[R]]: ...


class Signature(Generic[R]):
    """A task, its arguments and the options of one call, to store later,
    alone (``enqueue``) or as part of a chain, group or chord."""

    __slots__ = ("args", "definition", "enqueue_options", "only_failed", "receives")

    def __init__(
        self,
        definition: Definition[R],
        args: Mapping[str, Any],
        options: EnqueueOptions = NO_OPTIONS,
        receives: tuple[ReceiveKind | None, str] | None = None,
        only_failed: bool = False,
    ) -> None:
        self.definition = definition
        self.args = dict(args)
        self.enqueue_options = options
        self.receives = receives
        self.only_failed = only_failed
        """It runs only if a dependency did not succeed (see :func:`on_failure`)."""

    def __repr__(self) -> str:
        return f"<Signature {self.definition.name} {self.args!r}>"

    @property
    def name(self) -> str:
        """The task's name."""
        return self.definition.name

    @property
    def client(self) -> Client:
        """The client (or app) of the task's store."""
        return self.definition.client

    def options(self, **options: Unpack[OptionFields]) -> Signature[R]:
        """This signature with the options of one call on top (see
        :class:`conveyor.EnqueueOptions`)."""
        merged = options_from(self.enqueue_options, options)
        return Signature(self.definition, self.args, merged, self.receives, self.only_failed)

    def receiving(self, parameter: str, kind: ReceiveKind | None = None) -> Signature[R]:
        """This signature whose handler's ``parameter`` gets, when the task
        runs, the ``result`` of its (first) dependency, the ``results`` of
        all, or their ``outcomes`` (see :mod:`conveyor.dependencies`). By
        default a chord's callback receives the ``outcomes`` of its members,
        and any other task the ``result`` of its first dependency.
        ConfigurationError if the handler has no such parameter."""
        receives_text(kind or "result", parameter)
        if not self.definition.accepts(parameter):
            raise ConfigurationError(f"task {self.name!r} has no parameter {parameter!r}")
        return Signature(
            self.definition, self.args, self.enqueue_options, (kind, parameter), self.only_failed
        )

    def new_task(self, default_kind: ReceiveKind = "result") -> NewTask:
        """The task to store (checked and encoded, no I/O); it receives
        ``default_kind`` if it names a parameter but no kind."""
        kind, parameter = self.receives if self.receives is not None else (None, None)
        [task] = self.definition.new_tasks([self.args], self.enqueue_options, receives=parameter)
        task.receives = receives_text(kind or default_kind, parameter, self.only_failed)
        return task

    def enqueue(self, connection: Any = None) -> TaskHandle[R]:
        """Store this task alone; its handle once durable (``connection``:
        inside the caller's transaction, see :meth:`conveyor.App.enqueue`)."""
        handles = self.client.enqueue_new([self.new_task()], connection)
        return self.definition.typed_handles(handles)[0]

    async def enqueue_async(self, connection: Any = None) -> TaskHandle[R]:
        """Async form of :meth:`enqueue`."""
        handles = await self.client.enqueue_new_async([self.new_task()], connection)
        return self.definition.typed_handles(handles)[0]


def on_success(dependency: After, then: Signature[R]) -> Signature[R]:
    """``then``, to run once every task of ``dependency`` (a handle, an id,
    or several) has succeeded, cancelled if one fails or is cancelled
    (Celery's ``link``, RQ's ``on_success``). Store it with ``enqueue()``;
    ``.receiving(name)`` hands it the result."""
    return then.options(after=dependency, on_dependency_failure="cancel")


def on_failure(dependency: After, then: Signature[R]) -> Signature[R]:
    """``then``, to run once every task of ``dependency`` has ended, only if
    one of them failed or was cancelled (Celery's ``link_error``, RQ's
    ``on_failure``): if all succeeded, its worker ends it ``cancelled``
    without running it (error type ``NotNeeded``). Store it with
    ``enqueue()``; ``.receiving(name)`` hands it their ``outcomes``."""
    found = then.options(after=dependency, on_dependency_failure="run")
    receives = found.receives
    if receives is not None and receives[0] is None:
        receives = ("outcomes", receives[1])
    return Signature(found.definition, found.args, found.enqueue_options, receives, True)
