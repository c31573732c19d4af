"""Groups, chords and chains: many tasks stored as one, in one enqueue.

Each is built of signatures (``task.s(...)``, see :mod:`conveyor.signature`)
and stored all or none, in one enqueue, with its dependencies:

- :func:`group`: members that run in parallel; :class:`GroupHandle` awaits
  their results, cancels them, retries the failed ones.
- :func:`chord`: a group and a callback that waits for every member
  (``after``, policy ``run`` unless the callback's options say otherwise)
  and runs once after the last has ended, whatever way, receiving their
  ``outcomes`` in order when it names a parameter (``.receiving(name)``;
  another kind if it says so).
- :func:`chain`: links that run one after another, each waiting for the
  one before (policy ``cancel`` unless its options say otherwise: a link
  that fails cancels the rest), receiving its ``result`` when it names a
  parameter.

What the store guarantees of each (exactly-once release, whatever ends the
members) is the guarantee of dependencies: docs/guarantees.md,
"Dependencies". A structure's tasks must all be of one client (one store).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from conveyor.backends.params import NewTask, earlier
from conveyor.client import Client
from conveyor.dependencies import TaskOutcome
from conveyor.errors import ConfigurationError, InvalidTransitionError, ResultTimeoutError
from conveyor.handle import POLL_MAX, POLL_START, Portal, TaskHandle
from conveyor.model import TaskState
from conveyor.signature import Signature

R = TypeVar("R")
C = TypeVar("C")


def _client_of(signatures: Sequence[Signature[Any]]) -> Client:
    if not signatures:
        raise ConfigurationError("a group, chord or chain needs at least one task")
    client = signatures[0].client
    for signature in signatures[1:]:
        if signature.client is not client:
            raise ConfigurationError(
                "the tasks of a group, chord or chain must be of one app (one store)"
            )
    return client


def _waiting(task: NewTask, dependencies: Sequence[int], policy: str | None) -> NewTask:
    """``task`` waiting for ``dependencies`` too (after its own), under
    ``policy`` unless its options chose one."""
    task.after = (*task.after, *dependencies)
    if policy is not None:
        task.after_policy = policy
    return task


def _explicit_policy(signature: Signature[Any]) -> bool:
    return signature.enqueue_options.on_dependency_failure is not None


@dataclass(frozen=True)
class Group(Generic[R]):
    """Members to store at once; see :func:`group`."""

    members: tuple[Signature[R], ...]

    def new_tasks(self) -> list[NewTask]:
        """The members' tasks to store, in order (checked and encoded, no
        I/O): what ``enqueue`` stores, for a caller that stores them itself."""
        _client_of(self.members)
        return [member.new_task() for member in self.members]

    def enqueue(self, connection: Any = None) -> GroupHandle[R]:
        """Store every member, all or none; the group's handle once durable."""
        client = _client_of(self.members)
        return self._handle(client.enqueue_new(self.new_tasks(), connection))

    async def enqueue_async(self, connection: Any = None) -> GroupHandle[R]:
        """Async form of :meth:`enqueue`."""
        client = _client_of(self.members)
        return self._handle(await client.enqueue_new_async(self.new_tasks(), connection))

    def _handle(self, handles: list[TaskHandle[Any]]) -> GroupHandle[R]:
        return GroupHandle(tuple(_typed(self.members, handles)))


@dataclass(frozen=True)
class Chord(Generic[R, C]):
    """A group and a callback to run once after every member; see :func:`chord`."""

    group: Group[R]
    callback: Signature[C]

    def new_tasks(self) -> list[NewTask]:
        """The members' tasks and, last, the callback's, waiting for every
        member (checked and encoded, no I/O): what ``enqueue`` stores."""
        _client_of([*self.group.members, self.callback])
        members = self.group.new_tasks()
        policy = None if _explicit_policy(self.callback) else "run"
        callback = self.callback.new_task(default_kind="outcomes")
        last = _waiting(callback, [earlier(i) for i in range(len(members))], policy)
        return [*members, last]

    def enqueue(self, connection: Any = None) -> ChordHandle[R, C]:
        """Store the members and the callback, all or none; the chord's handle."""
        client = _client_of([*self.group.members, self.callback])
        return self._handle(client.enqueue_new(self.new_tasks(), connection))

    async def enqueue_async(self, connection: Any = None) -> ChordHandle[R, C]:
        """Async form of :meth:`enqueue`."""
        client = _client_of([*self.group.members, self.callback])
        return self._handle(await client.enqueue_new_async(self.new_tasks(), connection))

    def _handle(self, handles: list[TaskHandle[Any]]) -> ChordHandle[R, C]:
        members = self.group._handle(handles[:-1])
        [callback] = _typed([self.callback], handles[-1:])
        return ChordHandle(members, callback)


@dataclass(frozen=True)
class Chain(Generic[R]):
    """Links to run one after another; see :func:`chain`."""

    links: tuple[Signature[Any], ...]

    def new_tasks(self) -> list[NewTask]:
        """The links' tasks in order, each but the first waiting for the one
        before (checked and encoded, no I/O): what ``enqueue`` stores."""
        _client_of(self.links)
        tasks = [self.links[0].new_task()]
        for index, link in enumerate(self.links[1:]):
            tasks.append(_waiting(link.new_task(), [earlier(index)], None))
        return tasks

    def enqueue(self, connection: Any = None) -> ChainHandle[R]:
        """Store every link, all or none; the chain's handle once durable."""
        client = _client_of(self.links)
        return self._handle(client.enqueue_new(self.new_tasks(), connection))

    async def enqueue_async(self, connection: Any = None) -> ChainHandle[R]:
        """Async form of :meth:`enqueue`."""
        client = _client_of(self.links)
        return self._handle(await client.enqueue_new_async(self.new_tasks(), connection))

    def _handle(self, handles: list[TaskHandle[Any]]) -> ChainHandle[R]:
        return ChainHandle(tuple(_typed(self.links, handles)))


def group(*members: Signature[R] | Iterable[Signature[R]]) -> Group[R]:
    """Members that run in parallel, stored at once: ``group(resize.s(path=p)
    for p in paths)`` or ``group(a.s(), b.s())``."""
    return Group(tuple(_flat(members)))


def chord(members: Group[R] | Iterable[Signature[R]], callback: Signature[C]) -> Chord[R, C]:
    """A group and a callback that runs once after every member has ended,
    receiving their outcomes in order (:class:`~conveyor.TaskOutcome`) if it
    names a parameter: ``chord(members, summarize.s().receiving("outcomes"))``."""
    return Chord(members if isinstance(members, Group) else group(members), callback)


def chain(*links: Signature[Any]) -> Chain[Any]:
    """Links that run one after another, each once the one before succeeded:
    ``chain(fetch.s(url=u), parse.s().receiving("html"))``."""
    if not links:
        raise ConfigurationError("a chain needs at least one task")
    return Chain(tuple(links))


def _flat(members: Sequence[Signature[R] | Iterable[Signature[R]]]) -> list[Signature[R]]:
    flat: list[Signature[R]] = []
    for member in members:
        if isinstance(member, Signature):
            flat.append(member)
        else:
            flat.extend(member)
    for item in flat:
        if not isinstance(item, Signature):
            raise ConfigurationError(
                f"a group takes signatures (task.s(...)), not {type(item).__name__}"
            )
    return flat


def _typed(signatures: Sequence[Signature[Any]], handles: list[TaskHandle[Any]]) -> list[Any]:
    return [
        signature.definition.typed_handles([handle])[0]
        for signature, handle in zip(signatures, handles, strict=True)
    ]


# -- handles --------------------------------------------------------------------


@dataclass(frozen=True)
class GroupHandle(Generic[R]):
    """The stored members of a group, in order."""

    members: tuple[TaskHandle[R], ...]

    @property
    def ids(self) -> list[int]:
        """The members' ids, in order."""
        return [member.id for member in self.members]

    def __iter__(self) -> Iterator[TaskHandle[R]]:
        """The members' handles: ``after=group_handle`` waits for every member."""
        return iter(self.members)

    def __len__(self) -> int:
        return len(self.members)

    def results(self, timeout: float | None = None) -> list[R]:
        """Wait for every member and return their results in order. Raises
        TaskFailedError for the first member (in order) that ended failed or
        cancelled, ResultTimeoutError after ``timeout`` seconds."""
        return self._portal.run(self.results_async(timeout))

    async def results_async(self, timeout: float | None = None) -> list[R]:
        """Async form of :meth:`results`."""
        waits = [member.result_async(timeout) for member in self.members]
        found = await asyncio.gather(*waits, return_exceptions=True)
        for value in found:
            if isinstance(value, BaseException):
                raise value
        return list(found)  # type: ignore[arg-type]

    def outcomes(self, timeout: float | None = None) -> list[TaskOutcome]:
        """Wait for every member to end and return how each ended, in order."""
        return self._portal.run(self.outcomes_async(timeout))

    async def outcomes_async(self, timeout: float | None = None) -> list[TaskOutcome]:
        """Async form of :meth:`outcomes`."""
        return list(await asyncio.gather(*(_ended(m, timeout) for m in self.members)))

    def cancel(self) -> list[int]:
        """Cancel every member not ended yet; the ids of those cancelled (or,
        running, whose cancel was requested)."""
        return self._portal.run(self.cancel_async())

    async def cancel_async(self) -> list[int]:
        """Async form of :meth:`cancel`: bulk cancels of the members by id
        (one write per 500), each member judged by its state then."""
        cancelled: list[int] = await self._client.cancel_many_async(ids=self.ids)
        return cancelled

    def retry_failed(self) -> list[int]:
        """Retry every member that ended failed or cancelled (bulk retries by
        id, one write per 500); their ids. A chord's callback that its
        failed members ended is not retried with them: retry it too (or
        enqueue the chord again)."""
        return self._portal.run(self.retry_failed_async())

    async def retry_failed_async(self) -> list[int]:
        """Async form of :meth:`retry_failed`."""
        states = (TaskState.FAILED, TaskState.CANCELLED)
        retried: list[int] = await self._client.retry_many_async(states=states, ids=self.ids)
        return retried

    @property
    def _client(self) -> Any:
        return self.members[0].client

    @property
    def _portal(self) -> Portal:
        return self.members[0].client.portal


@dataclass(frozen=True)
class ChordHandle(Generic[R, C]):
    """A stored chord: its members and its callback."""

    group: GroupHandle[R]
    callback: TaskHandle[C]

    @property
    def id(self) -> int:
        """The callback's id: what ``after`` waits for when given this handle."""
        return self.callback.id

    def result(self, timeout: float | None = None) -> C:
        """Wait for the callback and return its result (see :meth:`TaskHandle.result`)."""
        return self.callback.result(timeout)

    async def result_async(self, timeout: float | None = None) -> C:
        """Async form of :meth:`result`."""
        return await self.callback.result_async(timeout)

    def cancel(self) -> list[int]:
        """Cancel the callback, then every member not ended yet; the ids cancelled."""
        portal: Portal = self.callback.client.portal
        return portal.run(self.cancel_async())

    async def cancel_async(self) -> list[int]:
        """Async form of :meth:`cancel`."""
        callback = await _cancel_each((self.callback,))
        return callback + await self.group.cancel_async()


@dataclass(frozen=True)
class ChainHandle(Generic[R]):
    """A stored chain: its links in order."""

    links: tuple[TaskHandle[Any], ...]

    @property
    def id(self) -> int:
        """The last link's id: what ``after`` waits for when given this handle."""
        return self.links[-1].id

    def result(self, timeout: float | None = None) -> R:
        """Wait for the last link and return its result. A link that failed
        cancels the rest (by default): TaskFailedError names the last one."""
        result: R = self.links[-1].result(timeout)
        return result

    async def result_async(self, timeout: float | None = None) -> R:
        """Async form of :meth:`result`."""
        result: R = await self.links[-1].result_async(timeout)
        return result

    def cancel(self) -> list[int]:
        """Cancel every link not ended yet, last first; the ids cancelled."""
        portal: Portal = self.links[0].client.portal
        return portal.run(self.cancel_async())

    async def cancel_async(self) -> list[int]:
        """Async form of :meth:`cancel`."""
        return await _cancel_each(tuple(reversed(self.links)))


async def _cancel_each(handles: Sequence[TaskHandle[Any]]) -> list[int]:
    cancelled = []
    for handle in handles:
        try:
            await handle.client.cancel_async(handle.id)  # type: ignore[attr-defined]
        except InvalidTransitionError:  # ended already (or by the cancel of another)
            continue
        cancelled.append(handle.id)
    return cancelled


async def _ended(handle: TaskHandle[Any], timeout: float | None) -> TaskOutcome:
    """How ``handle``'s task ended, once it has."""
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    delay = POLL_START
    while True:
        task = await handle.get_async()
        if task.state.is_terminal:
            last = task.last_attempt
            failed = task.state is not TaskState.SUCCEEDED and last is not None
            return TaskOutcome(
                task_id=task.id,
                name=task.name,
                state=task.state.value,
                result=task.result if task.state is TaskState.SUCCEEDED else None,
                error_type=last.error_type if failed and last is not None else None,
                error_message=last.error_message if failed and last is not None else None,
            )
        if deadline is not None and loop.time() >= deadline:
            raise ResultTimeoutError(f"task {task.id} is still {task.state.value}")
        await asyncio.sleep(delay if deadline is None else min(delay, deadline - loop.time()))
        delay = min(delay * 2, POLL_MAX)
