"""The Redis backend's writes beside the task lifecycle: operator controls
(cancel, retry, run now, delete, bulk retries), messages, retention,
schedules, pauses and workers, each one script (``lua/``)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from conveyor.backends.params import ScheduleSync, SendParams
from conveyor.backends.redis import (
    rows,
    schedules,
)
from conveyor.backends.redis.store import RedisStore
from conveyor.backends.stored import (
    check_recipient,
    delete_refused,
    transition_result,
)
from conveyor.errors import (
    BackendError,
)
from conveyor.model import (
    PauseKind,
    TaskState,
    check_pause,
)
from conveyor.records import (
    CancelMany,
    DeleteMany,
    PruneParams,
    PruneResult,
    RetryMany,
    TaskSelection,
    WorkerInfo,
)


class RedisControl(RedisStore):
    """Controls, sends, retention, schedules, pauses and workers on Redis."""

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
        TaskNotFoundError, or InvalidTransitionError for a running task or
        an unfinished child of a live parent (nothing deleted)."""
        found = await self._run("delete", [task_id])
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
        the ids deleted, ascending."""
        return [int(i) for i in await self._run("delete_many", _selection_args(selection))]

    async def send(self, params: SendParams) -> list[int]:
        """Deliver every message in one script (``send.lua``), all or none,
        and return their ids (ascending in send order). Raises
        TaskNotFoundError, NoInboxError or TaskFinishedError, sending
        nothing, for a recipient that cannot take a message; a delivery
        whose idempotency key its recipient was sent under already returns
        the first message's id and delivers nothing. Idempotency keys are
        kept as long as their recipient (deleted or pruned with it)."""
        deliveries = list(params.deliveries)
        if not deliveries:
            return []
        found = await self._run("send", [rows.now_arg(params.now), *rows.send_args(deliveries)])
        if not found[0]:
            _, task_id, state, inbox = found
            check_recipient(int(task_id), state or None, inbox == "1")
            raise BackendError(f"Redis refused a send to task {task_id} without a reason")
        return [int(message_id) for message_id in found[1:]]

    async def prune(self, params: PruneParams) -> PruneResult:
        """Delete one batch in one script (``prune.lua``): finished tasks past
        their state's cutoff, at most ``limit``, state by state in the order
        given, each with its attempt log, inbox, send keys and unique key,
        never a child of a live parent; and old workers. Within a state the
        oldest *finish* goes first (ids break ties): the other backends take
        the lowest ids first, so one batch may differ from theirs, never
        what a prune run to the end deletes. Never ``busy``: scripts do not
        overlap."""
        found = await self._run("prune", rows.prune_args(params))
        return PruneResult(tasks=int(found[0]), workers=int(found[1]))

    async def sync_schedules(self, params: ScheduleSync) -> bool:
        """Store an app's schedules in one script (see :class:`ScheduleSync`)."""
        return bool(await self._run("sync_schedules", schedules.sync_args(params)))

    async def pause(self, kind: PauseKind, name: str, now: datetime | None = None) -> bool:
        """Hold a queue or task name back from every claim and reclaim (each
        claim's script reads the pauses); False if it was paused already.
        Raises ConfigurationError for a bad kind or name."""
        kind, name = check_pause(kind, name)
        return bool(await self._run("pause", [rows.now_arg(now), kind.value, name]))

    async def resume(self, kind: PauseKind, name: str) -> bool:
        """Undo a pause and wake the queues it held back (see ``resume.lua``);
        False if it was not paused."""
        kind, name = check_pause(kind, name)
        return bool(await self._run("resume", [kind.value, name]))

    async def register_worker(self, info: WorkerInfo) -> None:
        """Record the worker as started and seen at the server's now, not
        stopped (one script). Kept until a prune with ``workers_before``."""
        await self._run("register_worker", [rows.now_arg(None), *rows.worker_args(info)])

    async def stop_worker(self, worker_id: str) -> None:
        """Mark a registered worker stopped (an unknown id changes nothing)."""
        await self._run("stop_worker", [rows.now_arg(None), worker_id])


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
