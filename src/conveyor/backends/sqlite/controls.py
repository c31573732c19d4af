"""Acting on stored tasks on SQLite: cancel, retry, run now, delete, and
their bulk forms.

:class:`Controls` is the section of
:class:`~conveyor.backends.sqlite.backend.SQLiteBackend` that does it. Each
action is one write transaction: a task changes only from a state that
allows it (else the action says why), and a bulk action acts on its whole
selection in that one transaction.
"""

from __future__ import annotations

import json
import sqlite3
from datetime import datetime

from conveyor.backends import wake
from conveyor.backends.sqlite import rows
from conveyor.backends.sqlite.database import Database
from conveyor.backends.sqlite.statements import SQL, clock
from conveyor.backends.stored import awaited_refusal, delete_refused, transition_result
from conveyor.model import TaskState
from conveyor.records import CancelMany, DeleteMany, RetryMany, TaskSelection


def _blocked(state: str | None, parent_state: str | None) -> bool:
    """Whether a delete is refused for the task's own state (running, or
    unfinished with a live parent): that reason is given first."""
    if state is None or state == TaskState.IN_PROGRESS:
        return True
    alive = parent_state is not None and not TaskState(parent_state).is_terminal
    return not TaskState(state).is_terminal and alive


class Controls:
    """``cancel``, ``retry``, ``run_now``, ``delete``, ``retry_many``,
    ``cancel_many`` and ``delete_many`` (see
    :class:`~conveyor.backends.protocol.Backend`)."""

    _db: Database
    _wake_key: str

    async def _transition(
        self, name: str, task_id: int, now: datetime | None, what: str
    ) -> TaskState:
        def change(conn: sqlite3.Connection) -> tuple[str | None, str | None]:
            args = {"id": task_id, "now": clock(conn, now)}
            row = conn.execute(SQL[name], args).fetchone()
            if row is not None:
                return row[0], None
            current = conn.execute(SQL["task_state"], {"id": task_id}).fetchone()
            return None, current[0] if current else None

        changed, current = await self._db.write(change)
        return transition_result(task_id, what, changed, current)

    async def cancel(self, task_id: int, now: datetime | None = None) -> TaskState:
        state = await self._transition("cancel", task_id, now, "cancel")
        wake.notify_all(self._wake_key)  # a parent may have an end message
        # Workers of this process hear of it at once (without an id: the
        # cancel of a coroutine task reaches its running children too);
        # others see the file change (see wakeups).
        wake.notify_cancel(self._wake_key, [None])
        return state

    async def retry(self, task_id: int, now: datetime | None = None) -> TaskState:
        return await self._transition("retry", task_id, now, "retry")

    async def run_now(self, task_id: int, now: datetime | None = None) -> TaskState:
        def move(conn: sqlite3.Connection) -> tuple[str | None, str | None]:
            args = {"id": task_id, "now": clock(conn, now)}
            moved = conn.execute(SQL["run_now"], args).fetchone()
            if moved is not None:
                return moved[0], None
            current = conn.execute(SQL["task_state"], {"id": task_id}).fetchone()
            return None, current[0] if current else None

        changed, current = await self._db.write(move)
        if changed is not None:
            wake.notify_all(self._wake_key)
        return transition_result(task_id, "run now", changed, current)

    async def delete(self, task_id: int) -> None:
        def delete(conn: sqlite3.Connection) -> tuple[str | None, str | None, bool] | None:
            if conn.execute(SQL["delete_task"], {"id": task_id}).fetchone() is not None:
                return None
            found = conn.execute(SQL["delete_blocker"], {"id": task_id}).fetchone()
            return (found[0], found[1], bool(found[2])) if found else (None, None, False)

        refused = await self._db.write(delete)
        if refused is not None:
            state, parent_state, awaited = refused
            if awaited and not _blocked(state, parent_state):
                raise awaited_refusal(task_id)
            raise delete_refused(task_id, state, parent_state)

    async def retry_many(self, selection: RetryMany) -> list[int]:
        ids = await self._act_on(selection, "retry_many")
        if ids:
            wake.notify_all(self._wake_key)
        return ids

    async def cancel_many(self, selection: CancelMany) -> list[int]:
        ids = await self._act_on(selection, "cancel_many")
        if ids:
            wake.notify_all(self._wake_key)  # a parent may have an end message
            wake.notify_cancel(self._wake_key, [None])  # running ones: see cancel
        return ids

    async def delete_many(self, selection: DeleteMany) -> list[int]:
        return await self._act_on(selection, "delete_many")

    async def _act_on(self, selection: TaskSelection, statement: str) -> list[int]:
        """Run a bulk action's statement on one selection, in one write."""

        def act(conn: sqlite3.Connection) -> list[int]:
            args = {
                "states": json.dumps([s.value for s in selection.states]),
                "ids": None if selection.ids is None else json.dumps(list(selection.ids)),
                "name": selection.name,
                "queue": selection.queue,
                "since": rows.seconds(selection.since),
                "until": rows.seconds(selection.until),
                "after": selection.after,
                "limit": selection.limit,
                "now": clock(conn, selection.now),
            }
            return sorted(r[0] for r in conn.execute(SQL[statement], args).fetchall())

        return await self._db.write(act)
