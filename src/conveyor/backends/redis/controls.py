"""Operators' actions on Redis tasks: cancel, retry, run now, delete, and
their bulk forms over a selection.

A mixin of :class:`~conveyor.backends.redis.backend.RedisBackend`: each
action is one script (``lua/``); a bulk form does one batch of its
selection per call (``select_tasks`` in ``lua/lib/controls.lua``). A
refused single action raises TaskNotFoundError or InvalidTransitionError.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from conveyor.backends.redis import rows
from conveyor.backends.redis.store import RedisStore
from conveyor.backends.stored import awaited_refusal, delete_refused, transition_result
from conveyor.model import TaskState
from conveyor.records import CancelMany, DeleteMany, RetryMany, TaskSelection


class Controls(RedisStore):
    """Cancel, retry, run now, delete, and their bulk forms."""

    async def cancel(self, task_id: int, now: datetime | None = None) -> TaskState:
        changed, current = await self._run("cancel", [rows.now_arg(now), task_id])
        return transition_result(task_id, "cancel", changed or None, current or None)

    async def retry(self, task_id: int, now: datetime | None = None) -> TaskState:
        changed, current = await self._run("retry", [rows.now_arg(now), task_id])
        return transition_result(task_id, "retry", changed or None, current or None)

    async def run_now(self, task_id: int, now: datetime | None = None) -> TaskState:
        """A pending task becomes due now (never later) and its queue is
        woken. Raises TaskNotFoundError, or InvalidTransitionError for a
        task in any other state."""
        changed, current = await self._run("run_now", [rows.now_arg(now), task_id])
        return transition_result(task_id, "run now", changed or None, current or None)

    async def delete(self, task_id: int) -> None:
        """Delete a task with its attempt log, inbox, send keys and unique
        key (one script); its children lose their parent. Raises
        TaskNotFoundError, or InvalidTransitionError for a running task, an
        unfinished child of a live parent, or a task an unfinished dependent
        waits for (nothing deleted). Its own edges go with it; its
        dependents' edges to it stay (they read it as no longer stored)."""
        found = await self._run("delete", [task_id])
        if found[0] == 2:
            raise awaited_refusal(task_id)
        if not found[0]:
            raise delete_refused(task_id, found[1] or None, found[2] or None)

    async def retry_many(self, selection: RetryMany) -> list[int]:
        """One batch of a bulk retry in one script (``retry_many.lua``; what
        its selection costs: ``select_tasks`` in ``lua/lib/controls.lua``): the ids
        retried, ascending."""
        args = [rows.now_arg(selection.now), *_selection_args(selection)]
        return [int(task_id) for task_id in await self._run("retry_many", args)]

    async def cancel_many(self, selection: CancelMany) -> list[int]:
        """One batch of a bulk cancel in one script (``cancel_many.lua``):
        the ids cancelled, ascending."""
        args = [rows.now_arg(selection.now), *_selection_args(selection)]
        return [int(task_id) for task_id in await self._run("cancel_many", args)]

    async def delete_many(self, selection: DeleteMany) -> list[int]:
        """One batch of a bulk delete in one script (``delete_many.lua``):
        the ids deleted, ascending; a task an unfinished dependent waits for
        is passed by."""
        return [int(i) for i in await self._run("delete_many", _selection_args(selection))]


def _selection_args(selection: TaskSelection) -> list[Any]:
    """A bulk action's selection as its script reads it (``selection_args``
    in ``lua/lib/controls.lua``)."""
    return [
        selection.after,
        selection.limit,
        rows.opt(selection.name),
        rows.opt(selection.queue),
        rows.opt(None if selection.since is None else rows.ms(selection.since)),
        rows.opt(None if selection.until is None else rows.ms(selection.until)),
        rows.opt(None if selection.ids is None else json.dumps([str(i) for i in selection.ids])),
        *dict.fromkeys(state.value for state in selection.states),
    ]
