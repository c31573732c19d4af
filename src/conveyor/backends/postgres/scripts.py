"""Writes of several statements, written once, run on async or sync connections.

A script is a generator: it yields ``(statement, arguments)`` and is sent
back that statement's rows, until it returns its result. :func:`run` drives
one on an ``AsyncConnection`` (the backend's pool, an application's async
connection), :func:`run_sync` on a ``Connection`` (an application's own,
for a transactional enqueue or send): one text of the logic for both. A
script runs inside the caller's transaction; it commits nothing itself.

Scripts here: inserting tasks (with idempotency keys and first messages)
and an outside send (its advisory locks, checks, idempotency keys).
"""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence
from datetime import datetime
from typing import Any, TypeVar

from psycopg import AsyncConnection, Connection

from conveyor.backends.params import Delivery, EnqueueParams, NewTask, check_after, earlier_index
from conveyor.backends.postgres.rows import (
    deliver_args,
    enqueue_statement,
    first_messages_args,
    key_pairs_args,
    keyed,
    keyed_args,
    keyed_ids,
    ordered_ids,
    replace_args,
)
from conveyor.backends.stored import check_recipient
from conveyor.errors import BackendError, TaskExistsError, TaskFinishedError, TaskNotFoundError
from conveyor.model import TaskState

T = TypeVar("T")
Rows = list[tuple[Any, ...]]
Step = tuple[bytes, Mapping[str, Any]]
Script = Generator[Step, Rows, T]
Statements = Mapping[str, bytes]


async def run(conn: AsyncConnection[Any], script: Script[T]) -> T:
    """Run ``script`` on ``conn``; its result."""
    try:
        step = next(script)
        while True:
            cursor = await conn.execute(*step)
            rows = await cursor.fetchall() if cursor.description else []
            step = script.send(rows)
    except StopIteration as finished:
        result: T = finished.value
        return result


def run_sync(conn: Connection[Any], script: Script[T]) -> T:
    """Run ``script`` on the synchronous ``conn``; its result."""
    try:
        step = next(script)
        while True:
            cursor = conn.execute(*step)
            rows = cursor.fetchall() if cursor.description else []
            step = script.send(rows)
    except StopIteration as finished:
        result: T = finished.value
        return result


KEYED_ROUNDS = 4
"""Rounds of a keyed insert at most: a key found held may be given up (its
holder left its scope, or its period ended) before its holder is read, and
the task is then inserted in the next round."""


def insert(sql: Statements, tasks: Sequence[NewTask], now: datetime | None) -> Script[list[int]]:
    """Insert ``tasks`` and their first messages; their ids in order. A task
    whose unique key a stored task holds is not inserted (nor its first
    message): see :func:`_insert_keyed`. A task with dependencies is stored
    waiting for them: see :func:`_wait_for`."""
    fresh = None
    if any(t.after for t in tasks):
        check_after(tasks)
        yield from _refuse_unknown(sql, tasks)
    if keyed(tasks):
        ids, fresh = yield from _insert_keyed(sql, tasks, now)
    else:
        name, args = enqueue_statement(EnqueueParams(tasks=tasks, now=now))
        ids = ordered_ids((yield sql[name], args))
    firsts = first_messages_args(tasks, ids, now, fresh)
    if firsts is not None:
        yield sql["first_messages"], firsts
    if any(t.after for t in tasks):
        yield from _wait_for(sql, tasks, ids, fresh or [True] * len(tasks), now)
    return ids


def _refuse_unknown(sql: Statements, tasks: Sequence[NewTask]) -> Generator[Step, Rows, None]:
    """TaskNotFoundError, before anything is inserted, for a dependency that
    names no stored task."""
    named = sorted({r for t in tasks for r in t.after if earlier_index(r) is None})
    if not named:
        return
    found = {int(r[0]) for r in (yield sql["dependencies_stored"], {"ids": named})}
    missing = [task_id for task_id in named if task_id not in found]
    if missing:
        raise TaskNotFoundError(f"no task with id {missing[0]} (a dependency)")


LOCK_ROUNDS = 1000
"""Rounds of ``lock_dependencies`` at most before an enqueue gives up
(BackendError): each waits for a transaction that held a dependency."""


def _lock_dependencies(
    sql: Statements, ids: Sequence[int]
) -> Generator[Step, Rows, dict[int, str]]:
    """Lock tasks ``ids`` (dependencies), mark them depended on, and read
    their states, never waiting for one while holding another (see
    ``lock_dependencies``); TaskNotFoundError for one deleted meanwhile."""
    yield sql["dependencies_savepoint"], {}
    for _ in range(LOCK_ROUNDS):
        locked = yield sql["lock_dependencies"], {"ids": list(ids)}
        states = {int(r[0]): str(r[1]) for r in locked}
        busy = [task_id for task_id in ids if task_id not in states]
        if not busy:
            yield sql["dependencies_release"], {}
            return states
        yield sql["dependencies_rollback"], {}
        waited = yield sql["wait_for_task"], {"id": busy[0]}
        yield sql["dependencies_rollback"], {}
        if not waited:  # deleted since it was checked
            raise TaskNotFoundError(f"no task with id {busy[0]} (a dependency)")
    raise BackendError("the tasks named as dependencies stayed locked; retry the enqueue")


def _wait_for(
    sql: Statements,
    tasks: Sequence[NewTask],
    ids: Sequence[int],
    fresh: Sequence[bool],
    now: datetime | None,
) -> Generator[Step, Rows, None]:
    """The edges of the tasks stored now with dependencies (not of one whose
    key a stored task holds), after their dependencies were locked and
    marked (``lock_dependencies``); then the ends of the dependencies found
    ended count at once (``settle_at_enqueue``)."""
    edges: list[tuple[int, int, int]] = []
    for task, task_id, new in zip(tasks, ids, fresh, strict=True):
        if task.after and new:
            for position, reference in enumerate(task.after):
                index = earlier_index(reference)
                edges.append((task_id, position, reference if index is None else ids[index]))
    if not edges:
        return
    wanted = sorted({depends_on for _, _, depends_on in edges})
    states = yield from _lock_dependencies(sql, wanted)
    yield (
        sql["insert_edges"],
        {
            "task_ids": [e[0] for e in edges],
            "positions": [e[1] for e in edges],
            "depends_on": [e[2] for e in edges],
        },
    )
    ended = [task_id for task_id in wanted if TaskState(states[task_id]).is_terminal]
    if ended:
        args = {"now": now, "ids": ended, "states": [states[i] for i in ended]}
        yield sql["settle_at_enqueue"], args


def _insert_keyed(
    sql: Statements, tasks: Sequence[NewTask], now: datetime | None
) -> Generator[Step, Rows, tuple[list[int], list[bool]]]:
    """Insert keyed tasks: each id, and whether it is new. The unique index
    decides who holds a key (a concurrent enqueue of one key waits for the
    other's commit, then finds it held). A held key answers by the task's
    ``on_conflict``: the holder's id; a pending holder replaced; or
    TaskExistsError (the caller's transaction then stores nothing). A key
    repeated within the batch is the batch's first task with it. Keys whose
    period has ended are given up first, so the tasks that take them over
    are inserted with the rest, in the batch's order.

    Enqueues of the same keys never deadlock, whatever their order: the
    batch's unique keys are locked, and its new concurrency keys made, in
    one order before any task is inserted (``lock_unique_keys``, ``ensure_keys``).
    Several enqueues in one caller's transaction are ordered by the caller."""
    ids: list[int | None] = [None] * len(tasks)
    fresh = [False] * len(tasks)
    todo = list(range(len(tasks)))
    made = yield from _before_keyed(sql, tasks, now)
    for _ in range(KEYED_ROUNDS):
        batch = [tasks[i] for i in todo]
        found, new = keyed_ids(batch, (yield sql["enqueue_keyed"], keyed_args(batch, now)))
        held = [i for i, task_id in zip(todo, found, strict=True) if task_id is None]
        for i, task_id, is_new in zip(todo, found, new, strict=True):
            ids[i], fresh[i] = task_id, is_new
        if not held:
            break
        holders = yield sql["stored_keys"], key_pairs_args([tasks[i] for i in held], now)
        by_pair = {(r[0], r[1]): (int(r[2]), bool(r[3])) for r in holders}
        over = [tasks[i] for i in held if by_pair.get(_key(tasks[i]), (0, False))[1]]
        if over:
            yield sql["release_keys"], key_pairs_args(over, now)
        todo = []
        replacing: list[tuple[NewTask, int]] = []
        for i in held:
            holder, ended = by_pair.get(_key(tasks[i]), (None, False))
            if holder is None or ended:
                todo.append(i)  # given up meanwhile: insert it in the next round
                continue
            ids[i] = holder
            task = tasks[i]
            if task.on_conflict == "raise":
                assert task.idempotency_key is not None
                raise TaskExistsError(task.name, task.idempotency_key, holder)
            if task.on_conflict == "replace":
                replacing.append((task, holder))
        if replacing:
            yield sql["replace_pending"], replace_args(replacing, now)
        if not todo:
            break
    if None in ids:
        raise BackendError("a unique key kept changing hands while this enqueue ran; retry it")
    yield from _after_keyed(sql, made, fresh)
    return [task_id for task_id in ids if task_id is not None], fresh


def _before_keyed(
    sql: Statements, tasks: Sequence[NewTask], now: datetime | None
) -> Generator[Step, Rows, list[str]]:
    """What a keyed insert does first: lock the batch's unique keys and make
    its new concurrency keys, each in one order (so two enqueues of the same
    keys never deadlock), and give up the unique keys whose period ended (so
    the tasks taking them over get ids in the batch's order)."""
    if any(t.idempotency_key is not None for t in tasks):
        yield sql["lock_unique_keys"], key_pairs_args(tasks)
        yield sql["release_keys"], key_pairs_args(tasks, now)
    if len({t.concurrency_key for t in tasks} - {None}) > 1:
        made = yield sql["ensure_keys"], keyed_args(tasks, now)
        return [str(row[0]) for row in made]
    return []


def _after_keyed(
    sql: Statements, made: list[str], fresh: list[bool]
) -> Generator[Step, Rows, None]:
    """What a keyed insert does last: when a task found its unique key taken
    (it inserted nothing), drop the key rows made for such tasks alone (a
    row would hold a limit no task of the key set)."""
    if made and not all(fresh):
        yield sql["drop_unused_keys"], {"keys": made}


def _key(task: NewTask) -> tuple[str, str | None]:
    return task.name, task.idempotency_key


def _pair(delivery: Delivery) -> tuple[int, str | None]:
    return delivery.task_id, delivery.idempotency_key


def _keys(deliveries: Sequence[Delivery]) -> dict[str, Any]:
    return {
        "task_ids": [d.task_id for d in deliveries],
        "keys": [d.idempotency_key for d in deliveries],
    }


def send(
    sql: Statements, deliveries: Sequence[Delivery], now: datetime | None
) -> Script[list[int]]:
    """An outside send: the recipients' advisory locks (see ``guard_send`` in
    sql/messages.sql), their checks, the messages; their ids in order. A delivery
    whose idempotency key its recipient got already sends nothing: the
    first message's id comes back (whatever the task's state now)."""
    everyone = {"ids": sorted({d.task_id for d in deliveries})}
    yield sql["guard_send"], everyone
    sent: dict[tuple[int, str | None], int] = {}
    keyed_ones = [d for d in deliveries if d.idempotency_key is not None]
    if keyed_ones:
        rows = yield sql["sent_keys"], _keys(keyed_ones)
        sent = {(r[0], r[1]): int(r[2]) for r in rows if r[2] is not None}
    todo = [i for i, d in enumerate(deliveries) if _pair(d) not in sent]
    taken: list[int] = []
    if todo:
        pending = [deliveries[i] for i in todo]
        rows = yield sql["recipients"], {"ids": sorted({d.task_id for d in pending})}
        found = {int(r[0]): (str(r[1]), bool(r[2])) for r in rows}
        for d in pending:
            state, inbox = found.get(d.task_id, (None, False))
            check_recipient(d.task_id, state, inbox)
        todo, taken = yield from _take_keys(sql, deliveries, todo, sent)
    ids = yield from _deliver(sql, deliveries, todo, now)
    if taken:
        kept = [(deliveries[i], ids[i]) for i in taken]
        yield (
            sql["keep_keys"],
            {
                **_keys([d for d, _ in kept]),
                "message_ids": [message_id for _, message_id in kept],
            },
        )
    return [ids[i] if i in ids else sent[_pair(d)] for i, d in enumerate(deliveries)]


def _take_keys(
    sql: Statements,
    deliveries: Sequence[Delivery],
    todo: list[int],
    sent: dict[tuple[int, str | None], int],
) -> Generator[Step, Rows, tuple[list[int], list[int]]]:
    """Take the keys of the keyed deliveries among ``todo``; those another
    send took meanwhile (and committed) go to ``sent``. The deliveries still
    to make, and the keyed ones among them."""
    keyed_todo = [i for i in todo if deliveries[i].idempotency_key is not None]
    if not keyed_todo:
        return todo, []
    rows = yield sql["take_keys"], _keys([deliveries[i] for i in keyed_todo])
    won = {(int(r[0]), r[1]) for r in rows}
    lost = [deliveries[i] for i in keyed_todo if _pair(deliveries[i]) not in won]
    if lost:
        rows = yield sql["sent_keys"], _keys(lost)
        sent.update({(r[0], r[1]): int(r[2]) for r in rows if r[2] is not None})
    still = [i for i in todo if _pair(deliveries[i]) not in sent]
    return still, [i for i in still if deliveries[i].idempotency_key is not None]


def _deliver(
    sql: Statements, deliveries: Sequence[Delivery], todo: list[int], now: datetime | None
) -> Generator[Step, Rows, dict[int, int]]:
    """Deliver ``todo``; each one's message id, by its position."""
    if not todo:
        return {}
    rows = yield sql["deliver"], deliver_args([deliveries[i] for i in todo], now)
    if len(rows) != len(todo):  # a recipient finished since it was checked
        raise TaskFinishedError("a recipient finished while the message was being sent")
    return {i: int(r[0]) for i, r in zip(todo, rows, strict=True)}
