"""Storing new tasks on Redis: plain, with unique keys (their scopes,
periods and conflicts), with first messages, and drawn in chunks.

A mixin of :class:`~conveyor.backends.redis.backend.RedisBackend`: every
enqueue is one script (``enqueue.lua``), all or none. A unique key is held
by its task through ``{p}:unique:...`` (see :mod:`.keys`), checked and
written by the enqueue's own script, so concurrent enqueues of one key
store one task; a key whose period ended is taken over lazily, by the next
enqueue that wants it. :func:`check_new` and :func:`stored_ids` serve the
other scripts that store tasks (a finish's spawns, a schedule's firing).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from conveyor.backends.params import EnqueueParams, NewTask, check_after
from conveyor.backends.redis import rows
from conveyor.backends.redis.store import RedisStore
from conveyor.errors import BackendError, ConfigurationError, TaskExistsError, TaskNotFoundError

PRIORITY_RANGE = range(-(2**31), 2**31)
"""The priorities the claim order's fixed-width members hold (32-bit, as
``conveyor.options.check_priority`` takes)."""


class Enqueue(RedisStore):
    """Enqueues, each one script."""

    async def enqueue(self, params: EnqueueParams) -> list[int]:
        """Store every task in one script, all or none; the ids of the tasks
        it stores ascend in input order, with their first messages (from
        their parent). A task whose unique key a stored task holds is not
        stored: by its ``on_conflict`` the holder's id comes back, a pending
        holder takes its payload, priority and due time, or TaskExistsError
        is raised and nothing of the enqueue is stored (checked in the same
        script, so concurrent enqueues of one key store one task). A task
        with dependencies (``after``) is stored waiting, with its edges, in
        the same script; those ended already count at once (see
        ``wait_for`` in ``lua/lib/enqueue.lua``); a dependency that names
        no stored task raises TaskNotFoundError, storing nothing. Raises
        ConfigurationError, storing nothing, for a priority beyond 32 bits
        or dependencies that could form a cycle (before any I/O)."""
        tasks = list(params.tasks)
        check_after(tasks)
        if not tasks:
            return []
        for task in tasks:
            check_new(task)
        args = [rows.now_arg(params.now), rows.tasks_arg(tasks)]
        return stored_ids(tasks, await self._run("enqueue", args))

    async def enqueue_chunks(self, chunks: Iterable[Sequence[NewTask]]) -> list[int]:
        """Every chunk drawn first, then one script stores them all (all or none)."""
        return await self.enqueue(EnqueueParams.gathered(chunks))


def stored_ids(tasks: Sequence[NewTask], found: list[Any]) -> list[int]:
    """The ids an enqueue (or a fire) returned: ``{1, ids...}``; ``{2}``, a
    fire whose slots were not its own; ``{3, id}``, a dependency not stored;
    or ``{0, index, holder}``, refused."""
    if found[0] == 2:
        return []
    if found[0] == 3:
        raise TaskNotFoundError(f"no task with id {int(found[1])} (a dependency)")
    if not found[0]:
        refused, holder = tasks[int(found[1])], int(found[2])
        if refused.idempotency_key is None:
            raise BackendError("Redis refused a task without a unique key")
        raise TaskExistsError(refused.name, refused.idempotency_key, holder)
    return [int(task_id) for task_id in found[1:]]


def check_new(task: NewTask) -> None:
    """Raise ConfigurationError for a priority beyond 32 bits."""
    if task.priority not in PRIORITY_RANGE:
        raise ConfigurationError(f"priority must fit in 32 bits, not {task.priority}")
