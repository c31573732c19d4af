"""Operators' actions on PostgreSQL tasks: cancel, retry, run now, delete, and
their bulk forms over a selection.

A mixin of :class:`~conveyor.backends.postgres.backend.PostgresBackend`:
each action is one statement of sql/controls.sql; a refused single action
reads the task's state after, to say why (a task gone, or in a state the
action does not apply to).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from conveyor.backends.postgres.pools import Pools
from conveyor.backends.stored import awaited_refusal, delete_refused, transition_result
from conveyor.model import TaskState
from conveyor.records import CancelMany, DeleteMany, RetryMany, TaskSelection


class Controls(Pools):
    """``cancel``, ``retry``, ``run_now``, ``delete`` and ``retry_many``,
    ``cancel_many``, ``delete_many`` (see
    :class:`~conveyor.backends.protocol.Backend` and
    :class:`~conveyor.backends.capabilities.Inspector`)."""

    async def _transition(
        self, name: str, task_id: int, now: datetime | None, what: str
    ) -> TaskState:
        rows = await self._fetchall(name, {"id": task_id, "now": now})
        if rows:
            return TaskState(rows[0][0])
        current = await self._fetchall("task_state", {"id": task_id})
        return transition_result(task_id, what, None, current[0][0] if current else None)

    async def cancel(self, task_id: int, now: datetime | None = None) -> TaskState:
        return await self._transition("cancel", task_id, now, "cancel")

    async def retry(self, task_id: int, now: datetime | None = None) -> TaskState:
        return await self._transition("retry", task_id, now, "retry")

    async def run_now(self, task_id: int, now: datetime | None = None) -> TaskState:
        rows = await self._fetchall("run_now", {"id": task_id, "now": now})
        if rows:
            return TaskState(rows[0][0])
        current = await self._fetchall("task_state", {"id": task_id})
        return transition_result(task_id, "run now", None, current[0][0] if current else None)

    async def delete(self, task_id: int) -> None:
        if await self._fetchall("delete_task", {"id": task_id}):
            return
        found = await self._fetchall("delete_blocker", {"id": task_id})
        if found and found[0][2]:
            raise awaited_refusal(task_id)
        raise delete_refused(task_id, *(found[0][:2] if found else (None, None)))

    async def retry_many(self, selection: RetryMany) -> list[int]:
        return list((await self._fetchall("retry_many", _selected(selection)))[0][0])

    async def cancel_many(self, selection: CancelMany) -> list[int]:
        return list((await self._fetchall("cancel_many", _selected(selection)))[0][0])

    async def delete_many(self, selection: DeleteMany) -> list[int]:
        return list((await self._fetchall("delete_many", _selected(selection)))[0][0])


def _selected(selection: TaskSelection) -> dict[str, Any]:
    """The arguments of a bulk action's statement (``part_selected``)."""
    return {
        "states": [s.value for s in selection.states],
        "ids": None if selection.ids is None else list(selection.ids),
        "name": selection.name,
        "queue": selection.queue,
        "since": selection.since,
        "until": selection.until,
        "after": selection.after,
        "limit": selection.limit,
        "now": selection.now,
    }
