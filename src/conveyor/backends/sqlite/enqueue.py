"""Inserting tasks on SQLite: plain, with a unique key, with dependencies,
and in the caller's own transaction.

:func:`insert_tasks` runs inside the caller's write transaction (BEGIN
IMMEDIATE, or the caller's own): under SQLite's one writer, a key's holder
read and the insert that follows it see no other write between them.
:class:`Enqueuing` is the section of
:class:`~conveyor.backends.sqlite.backend.SQLiteBackend` that enqueues.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterable, Sequence
from typing import Any

from conveyor.backends import wake
from conveyor.backends.params import EnqueueParams, NewTask, check_after, earlier_index
from conveyor.backends.sqlite import rows
from conveyor.backends.sqlite.database import Database, translated_errors
from conveyor.backends.sqlite.statements import SQL, clock
from conveyor.errors import ConfigurationError, TaskExistsError, TaskNotFoundError
from conveyor.model import TaskState


def insert_tasks(conn: sqlite3.Connection, params: EnqueueParams, now: float) -> list[int]:
    """Insert tasks and their first messages; their ids in input order. A
    task whose name and unique key a stored task holds is not inserted (nor
    its first message, nor its edges): see :func:`_insert_keyed`. A task with
    dependencies is stored waiting with its edges (see :func:`_wait_for`);
    a dependency that is not stored raises TaskNotFoundError before any
    insert."""
    check_after(params.tasks)
    waits = any(t.after for t in params.tasks)
    if waits:
        _refuse_unknown_dependencies(conn, params.tasks)
    values = rows.enqueue_rows(params, now)
    if any(t.idempotency_key is not None for t in params.tasks):
        # A savepoint: a TaskExistsError midway leaves the transaction as it
        # was. Begun first, as sqlite3 would before an insert: a savepoint
        # outside a transaction would commit at its release.
        if not conn.in_transaction:
            conn.execute("begin")
        conn.execute("savepoint conveyor_enqueue")
        try:
            ids, fresh = _insert_keyed(conn, params.tasks, values)
        except BaseException:
            conn.execute("rollback to conveyor_enqueue")
            conn.execute("release conveyor_enqueue")
            raise
        conn.execute("release conveyor_enqueue")
    else:
        conn.executemany(SQL["enqueue"], values)
        # Under the write lock rowids are drawn one after another: the last
        # one and the count give every id, in input order.
        last: int = conn.execute("select last_insert_rowid()").fetchone()[0]
        ids = list(range(last - len(params.tasks) + 1, last + 1))
        fresh = [True] * len(ids)
    firsts = [
        {
            "task_id": task_id,
            "sender_id": t.parent_id,
            "body": t.message,
            "now": now,
            "trace": t.trace,
        }
        for task_id, t, new in zip(ids, params.tasks, fresh, strict=True)
        if t.message is not None and new
    ]
    if firsts:
        conn.executemany(SQL["first_message"], firsts)
    for index, (task, new) in enumerate(zip(params.tasks, fresh, strict=True) if waits else ()):
        if task.after and new:
            _wait_for(conn, task, ids[index], [_resolved(ref, ids) for ref in task.after], now)
    return ids


def _refuse_unknown_dependencies(conn: sqlite3.Connection, tasks: Sequence[NewTask]) -> None:
    stored = [ref for t in tasks for ref in t.after if earlier_index(ref) is None]
    if stored:
        missing = conn.execute(SQL["unknown_dependencies"], {"ids": json.dumps(stored)}).fetchone()
        if missing is not None:
            raise TaskNotFoundError(f"no task with id {missing[0]} (a dependency)")


def _wait_for(
    conn: sqlite3.Connection, task: NewTask, task_id: int, dependencies: Sequence[int], now: float
) -> None:
    """Task ``task_id``, just stored waiting, waits for ``dependencies`` (in
    order): its edges are stored and the tasks it names marked awaited; those
    that have ended already count now, in order, as if they ended now (as
    the trigger ``conveyor_dependency_ended`` counts an end)."""
    conn.executemany(
        SQL["add_dependency"],
        [
            {"dependent_id": task_id, "position": position, "task_id": dependency}
            for position, dependency in enumerate(dependencies)
        ],
    )
    unique = list(dict.fromkeys(dependencies))
    states = dict(conn.execute(SQL["mark_awaited"], {"ids": json.dumps(unique)}).fetchall())
    ended = [d for d in unique if TaskState(states[d]).is_terminal]
    if not ended:
        return
    conn.execute(
        SQL["settle_ended"], {"dependent_id": task_id, "ids": json.dumps(ended), "now": now}
    )
    state, waiting_for = TaskState.WAITING, len(dependencies)
    for dependency in ended:
        if state is not TaskState.WAITING:
            break
        if states[dependency] == TaskState.SUCCEEDED or task.after_policy == "run":
            waiting_for -= dependencies.count(dependency)
            if waiting_for == 0:
                state = TaskState.PENDING
        else:
            state = TaskState.FAILED if task.after_policy == "fail" else TaskState.CANCELLED
    args = {"id": task_id, "state": state.value, "waiting_for": waiting_for, "now": now}
    conn.execute(SQL["count_ended" if state is TaskState.WAITING else "end_waiting"], args)


def _resolved(reference: int, ids: Sequence[int]) -> int:
    """The id a ``NewTask.after`` entry names, given the batch's ids."""
    position = earlier_index(reference)
    return reference if position is None else ids[position]


def _insert_keyed(
    conn: sqlite3.Connection, tasks: Sequence[NewTask], values: list[dict[str, Any]]
) -> tuple[list[int], list[bool]]:
    """Insert one task at a time (under the write lock: no one else writes
    meanwhile): each id, and whether it is new. A key whose holder's period
    is over is freed first; a held key answers by the task's
    ``on_conflict`` (a key repeated in the batch is the batch's first task)."""
    ids, fresh = [], []
    mine: set[int] = set()
    for task, value in zip(tasks, values, strict=True):
        held = None
        if task.idempotency_key is not None:
            held = conn.execute(SQL["stored_key"], value).fetchone()
            if held is not None and held[1]:
                conn.execute(SQL["release_key"], {"id": held[0]})
                held = None
        if held is None:
            inserted = conn.execute(SQL["enqueue_keyed"], value).fetchone()
            ids.append(int(inserted[0]))
            fresh.append(True)
            mine.add(int(inserted[0]))
            continue
        holder = int(held[0])
        if holder not in mine:
            if task.on_conflict == "raise":
                assert task.idempotency_key is not None
                raise TaskExistsError(task.name, task.idempotency_key, holder)
            if task.on_conflict == "replace":
                conn.execute(SQL["replace_pending"], {**value, "id": holder})
        ids.append(holder)
        fresh.append(False)
    return ids, fresh


def check_caller(connection: Any, path: str) -> None:
    """The caller's connection: a sqlite3.Connection on the file at ``path``,
    in a transaction (ConfigurationError otherwise)."""
    if not isinstance(connection, sqlite3.Connection):
        raise ConfigurationError("transactional writes take the caller's sqlite3.Connection")
    with translated_errors():
        _check_same_file(connection, path)
    if connection.isolation_level is None and not connection.in_transaction:
        raise ConfigurationError(
            "the connection is in autocommit mode with no open transaction: "
            "run BEGIN first, so these writes commit with your own"
        )


def _check_same_file(connection: sqlite3.Connection, path: str) -> None:
    for _seq, name, file in connection.execute("pragma database_list"):
        if name == "main":
            if not file or os.path.realpath(file) != os.path.realpath(path):
                raise ConfigurationError(
                    f"the connection is on {file or 'a temporary database'!r}, "
                    f"not on this backend's file {path!r}"
                )
            return


class Enqueuing:
    """``enqueue`` and ``enqueue_chunks`` (see
    :class:`~conveyor.backends.protocol.Backend`), ``enqueue_in`` and
    ``enqueue_in_sync`` (see
    :class:`~conveyor.backends.capabilities.TransactionalEnqueue`)."""

    path: str
    _db: Database
    _wake_key: str

    def _insert(self, conn: sqlite3.Connection, params: EnqueueParams) -> list[int]:
        return insert_tasks(conn, params, clock(conn, params.now))

    async def enqueue(self, params: EnqueueParams) -> list[int]:
        if not params.tasks:
            return []
        check_after(params.tasks)  # before the write lock is taken
        ids = await self._db.write(lambda conn: self._insert(conn, params))
        wake.notify(self._wake_key, (t.queue for t in params.tasks))
        return ids

    async def enqueue_chunks(self, chunks: Iterable[Sequence[NewTask]]) -> list[int]:
        return await self.enqueue(EnqueueParams.gathered(chunks))

    async def enqueue_in(self, params: EnqueueParams, connection: Any) -> list[int]:
        """As :meth:`enqueue_in_sync`: the caller's connection belongs to the
        caller's thread, so the insert runs there."""
        return self.enqueue_in_sync(params, connection)

    def enqueue_in_sync(self, params: EnqueueParams, connection: Any) -> list[int]:
        """Insert on the caller's ``sqlite3.Connection``, inside its open
        transaction (begun explicitly, or implicitly by Python's sqlite3
        before the first insert); the caller commits. The connection must be
        on this backend's file."""
        check_caller(connection, self.path)
        if not params.tasks:
            return []
        with translated_errors():
            ids = self._insert(connection, params)
        wake.notify(self._wake_key, (t.queue for t in params.tasks))
        return ids
