"""The SQLite backend: one file, several worker processes on one machine.

Guarantees: the same contract as PostgreSQL for leases, fencing, the attempt
log, the crash budget, cancel and timeouts. Every write is one ``BEGIN
IMMEDIATE`` transaction, so a claim, its attempt rows and any reclaim it
does commit together or not at all; SQLite's clock rules lease expiry.

Limits, stated plainly: one writer at a time (writes from all processes
queue on the file's lock, which bounds throughput); processes must share
one machine and a local disk (SQLite's locks do not work over network file
systems); no attempt transactions (a handler holding the write lock for its
whole run would stall every other worker's heartbeats). Idle workers wake
at once for enqueues made in their own process, and within about 10 ms for
commits made by other processes (they watch ``PRAGMA data_version``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sqlite3
from collections.abc import AsyncIterator, Sequence
from datetime import datetime
from typing import Any

from conveyor.backends import wake
from conveyor.backends.params import (
    CancelHint,
    ClaimedTask,
    ClaimParams,
    FinishParams,
    FinishResult,
    HeartbeatParams,
    HeartbeatResult,
    Wakeup,
    WorkFilter,
)
from conveyor.backends.protocol import Capability
from conveyor.backends.sqlite import rows
from conveyor.backends.sqlite.database import (
    DEFAULT_BUSY_TIMEOUT,
    SYNCHRONOUS,
    Database,
    check_version,
    connect,
)
from conveyor.backends.sqlite.enqueue import Enqueuing
from conveyor.backends.sqlite.flow import FlowControl, keyed_candidates, served, settle_keys
from conveyor.backends.sqlite.messages import Messages, apply_effects, holding, rewake
from conveyor.backends.sqlite.reads import Listings
from conveyor.backends.sqlite.schema import Schema
from conveyor.backends.sqlite.statements import SQL
from conveyor.backends.sqlite.statements import clock as _clock
from conveyor.backends.stored import (
    LEASE_EXPIRED,
    claimed_rows,
    corrupt_counter_message,
    lease_lost_message,
    transition_result,
)
from conveyor.backends.sweep import DEFAULT_SWEEP_INTERVAL, Sweep
from conveyor.errors import ConfigurationError
from conveyor.model import Attempt, LeaseToken, Task, TaskState
from conveyor.records import TaskCount, WorkerInfo

log = logging.getLogger("conveyor.sqlite")
CHANGE_POLL_INTERVAL = 0.01
"""Seconds between checks for commits made by other processes (wake-ups),
once none has come for ``CHANGE_BUSY_WINDOW``."""
CHANGE_POLL_BUSY = 0.002
"""Seconds between those checks within ``CHANGE_BUSY_WINDOW`` of the last
commit seen: while work keeps coming, a commit is seen within 2 ms."""
CHANGE_BUSY_WINDOW = 1.0


class SQLiteBackend(Schema, Enqueuing, Messages, Listings, FlowControl):
    """Tasks in a SQLite file (``sqlite:///relative.db``, ``sqlite:////abs.db``).

    ``migrate`` says what :meth:`open` does: True applies the pending
    migrations (creating the file at first use), False refuses a file that
    does not exist or is behind (StoreNotReadyError) and creates nothing,
    None only opens the file (creating it)."""

    capabilities = frozenset(
        {Capability.TRANSACTIONAL_ENQUEUE, Capability.NOTIFICATIONS, Capability.INSPECT}
    )

    def __init__(
        self,
        path: str,
        *,
        busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
        synchronous: str = "full",
        migrate: bool | None = True,
        sweep_interval: float = DEFAULT_SWEEP_INTERVAL,
        **_options: Any,
    ) -> None:
        check_version()
        if not path or path == ":memory:" or path.startswith("file:"):
            raise ConfigurationError(
                f"SQLite needs a file path, not {path!r}; for a store in memory use memory://NAME"
            )
        if synchronous not in SYNCHRONOUS:
            raise ConfigurationError(f"synchronous must be one of {', '.join(SYNCHRONOUS)}")
        if busy_timeout < 0:
            raise ConfigurationError("busy_timeout must be >= 0 seconds")
        self.path = os.path.abspath(path)
        self._busy_timeout = busy_timeout
        self._synchronous = synchronous
        self._auto_migrate = migrate
        self._sweep = Sweep(sweep_interval)
        self._wake_key = f"sqlite:{os.path.realpath(self.path)}"
        self._db = Database(self.path, busy_timeout, synchronous)

    async def open(self) -> None:
        """Open the file (creating it) and apply the pending migrations; with
        ``migrate=False``, refuse a file that does not exist or is behind,
        read on a read-only connection first: neither created nor changed
        (a file of another program is not even switched to WAL). Nothing
        is left open when it raises."""
        if self._auto_migrate is False:
            await asyncio.to_thread(self._require_file)
        await self._db.open()
        if not self._auto_migrate:
            return
        try:
            await self.migrate()
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        await self._db.close()

    # -- claim, heartbeat, finish ---------------------------------------

    async def claim(self, params: ClaimParams) -> list[ClaimedTask]:
        if params.limit <= 0 or not params.names or not params.queues:
            return []
        with self._sweep.turn() as sweep:
            return await self._db.write(lambda conn: self._claim(conn, params, sweep))

    def _claim(
        self, conn: sqlite3.Connection, params: ClaimParams, sweep: bool
    ) -> list[ClaimedTask]:
        now = _clock(conn, params.now)
        params = served(conn, params)
        scope = {
            "now": now,
            "queues": json.dumps(list(params.queues)),
            "names": json.dumps(list(params.names)),
        }
        if sweep:
            self._quarantine(conn, params, scope)
        ended = conn.execute(SQL["end_expired"], scope).fetchall()
        if ended:
            conn.executemany(
                SQL["close_lost_attempt"],
                [
                    {
                        "now": now,
                        "task_id": task_id,
                        "message": lease_lost_message(
                            state == TaskState.CANCELLED, spent, max_attempts
                        ),
                    }
                    for task_id, state, spent, max_attempts in ended
                ],
            )
        picked = self._pick(conn, params, scope)
        if not picked:
            return []
        reclaimed = [
            {"now": now, "task_id": task_id, "message": LEASE_EXPIRED}
            for task_id, state in picked
            if state == TaskState.IN_PROGRESS
        ]
        if reclaimed:
            conn.executemany(SQL["close_lost_attempt"], reclaimed)
        ids = json.dumps([task_id for task_id, _state in picked])
        taken = conn.execute(
            SQL["claim_take"],
            {"now": now, "ids": ids, "worker_id": params.worker_id, "lease": params.lease},
        ).fetchall()
        conn.execute(SQL["claim_log"], {"now": now, "ids": ids, "worker_id": params.worker_id})
        order = {task_id: index for index, (task_id, _state) in enumerate(picked)}
        taken.sort(key=lambda row: order[row[0]])
        worker = params.worker_id
        claimed, unread = claimed_rows(taken, lambda row: rows.claimed_task(row, worker), worker)
        for bad in unread:
            if bad.token is not None:
                self._set_aside(conn, bad.token, bad.why, now)
        return claimed

    @staticmethod
    def _set_aside(conn: sqlite3.Connection, token: LeaseToken, why: str, now: float) -> None:
        """A claimed row that does not read ends failed in the claim's own
        transaction, its attempt saying why (``CorruptTask``): the rest of
        the claim runs."""
        conn.execute(SQL["quarantine_end"], {"task_id": token.task_id, "now": now})
        args = {"task_id": token.task_id, "number": token.attempt, "now": now, "message": why}
        conn.execute(SQL["quarantine_log"], {**args, "worker_id": token.worker_id})

    @staticmethod
    def _quarantine(conn: sqlite3.Connection, params: ClaimParams, scope: dict[str, Any]) -> None:
        """End failed the tasks whose counters stand at the limit (see
        ``quarantine_find`` in sql/attempts.sql), saying why in their attempt log."""
        # Read them all first: each update below takes its row out of the
        # index the query walks.
        stuck = conn.execute(SQL["quarantine_find"], scope).fetchall()
        for task_id, attempt, spent, state in stuck:
            conn.execute(SQL["quarantine_end"], {"task_id": task_id, "now": scope["now"]})
            conn.execute(
                SQL["quarantine_log"],
                {
                    "task_id": task_id,
                    "number": attempt if state == TaskState.IN_PROGRESS else attempt + 1,
                    "worker_id": params.worker_id,
                    "now": scope["now"],
                    "message": corrupt_counter_message(attempt, spent),
                },
            )
            log.error("failed task %s: %s", task_id, corrupt_counter_message(attempt, spent))

    @staticmethod
    def _pick(
        conn: sqlite3.Connection, params: ClaimParams, scope: dict[str, Any]
    ) -> list[tuple[int, str]]:
        """The next ``limit`` tasks in claim order (priority, then run_at, then id):
        the head of each queue and the expired leases, merged here."""
        limit = params.limit
        candidates = conn.execute(SQL["claim_expired"], {**scope, "limit": limit}).fetchall()
        for queue in dict.fromkeys(params.queues):
            args = {**scope, "queue": queue, "limit": limit}
            candidates += conn.execute(SQL["claim_due"], args).fetchall()
        keyed, keys = keyed_candidates(conn, scope, limit)
        candidates += keyed
        candidates.sort(key=lambda row: (-row[2], row[3], row[0]))
        chosen = candidates[:limit]
        if keys:
            taken = {row[0] for row in chosen}
            settle_keys(conn, scope["now"], keys, [row for row in keyed if row[0] in taken])
        return [(row[0], row[1]) for row in chosen]

    async def heartbeat(self, params: HeartbeatParams) -> HeartbeatResult:
        tokens = list(params.tokens)
        registered = True  # the worker's row was there

        def renew(conn: sqlite3.Connection) -> list[Any]:
            nonlocal registered
            now = _clock(conn, params.now)
            seen = conn.execute(SQL["heartbeat_seen"], {"now": now, "worker_id": params.worker_id})
            registered = seen.rowcount > 0
            if not tokens:
                return []
            return conn.execute(
                SQL["heartbeat"],
                {
                    "now": now,
                    "worker_id": params.worker_id,
                    "leases": rows.leases_json(tokens),
                    "lease": params.lease,
                },
            ).fetchall()

        found = {(r[0], r[1]): bool(r[2]) for r in await self._db.write(renew)}
        renewed = frozenset(t for t in tokens if (t.task_id, t.attempt) in found)
        return HeartbeatResult(
            renewed=renewed,
            lost=frozenset(tokens) - renewed,
            cancel_requested=frozenset(t for t in renewed if found[(t.task_id, t.attempt)]),
            registered=registered,
        )

    async def finish(self, params: FinishParams) -> FinishResult:
        completions = list(params.completions)
        if not completions:
            return FinishResult(frozenset(), frozenset())

        parents: list[int | None] = []
        due: set[str] = set()

        effects = [c for c in completions if c.effects is not None]

        def record(conn: sqlite3.Connection) -> set[tuple[int, int]]:
            now = _clock(conn, params.now)
            if effects:
                apply_effects(conn, holding(conn, params.worker_id, effects, now), now)
            found = conn.execute(
                SQL["finish"],
                {
                    "now": now,
                    "worker_id": params.worker_id,
                    "completions": rows.completions_json(completions),
                },
            ).fetchall()
            parents.extend(r[2] for r in found)
            due.update(r[3] for r in found if r[4])
            done = {(r[0], r[1]) for r in found}
            applied = [c for c in completions if (c.token.task_id, c.token.attempt) in done]
            if applied:
                conn.execute(
                    SQL["finish_log"], {"now": now, "completions": rows.completions_json(applied)}
                )
                rewake(conn, applied, now)
            return done

        done = await self._db.write(record)
        if effects or any(p for p in parents):
            # Sends, spawns and a child's end woke tasks the queues of which
            # this process does not know: every local worker looks.
            wake.notify_all(self._wake_key)
        elif due:  # a workflow's next step, a release, a key's freed slot
            wake.notify(self._wake_key, due)
        tokens = [c.token for c in completions]
        applied = frozenset(t for t in tokens if (t.task_id, t.attempt) in done)
        return FinishResult(applied=applied, rejected=frozenset(tokens) - applied)

    # -- control ---------------------------------------------------------

    async def _transition(
        self, name: str, task_id: int, now: datetime | None, what: str
    ) -> TaskState:
        def change(conn: sqlite3.Connection) -> tuple[str | None, str | None]:
            args = {"id": task_id, "now": _clock(conn, now)}
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

    async def cancel_requested(
        self, worker_id: str, tokens: Sequence[LeaseToken]
    ) -> frozenset[LeaseToken]:
        if not tokens:
            return frozenset()
        args = {"worker_id": worker_id, "leases": rows.leases_json(tokens)}
        found = await self._db.read(
            lambda conn: {(r[0], r[1]) for r in conn.execute(SQL["cancel_requested"], args)}
        )
        return frozenset(t for t in tokens if (t.task_id, t.attempt) in found)

    async def retry(self, task_id: int, now: datetime | None = None) -> TaskState:
        return await self._transition("retry", task_id, now, "retry")

    # -- reads -----------------------------------------------------------

    async def get_task(self, task_id: int, with_attempts: bool = True) -> Task | None:
        def fetch(conn: sqlite3.Connection) -> Task | None:
            row = conn.execute(SQL["get_task"], {"id": task_id}).fetchone()
            if row is None:
                return None
            attempts: tuple[Attempt, ...] = ()
            if with_attempts:
                found = conn.execute(SQL["get_attempts"], {"id": task_id}).fetchall()
                attempts = tuple(rows.attempt(r) for r in found)
            return rows.task(row, attempts)

        return await self._db.read(fetch)

    async def count_tasks(self) -> list[TaskCount]:
        found = await self._db.read(lambda conn: conn.execute(SQL["count_tasks"]).fetchall())
        return [TaskCount(TaskState(r[0]), r[1], r[2], r[3]) for r in found]

    async def count_unfinished(self, work: WorkFilter) -> int:
        def count(conn: sqlite3.Connection) -> int:
            args = {
                "now": _clock(conn, work.now),
                "queues": json.dumps(list(work.queues)),
                "names": json.dumps(list(work.names)),
            }
            value: int = conn.execute(SQL["count_unfinished"], args).fetchone()[0]
            return value

        return await self._db.read(count)

    async def next_due_at(self, queues: Sequence[str]) -> datetime | None:
        args = {"queues": json.dumps(list(queues))}
        value = await self._db.read(
            lambda conn: conn.execute(SQL["next_run_at"], args).fetchone()[0]
        )
        return rows.moment(value)

    # -- workers ---------------------------------------------------------

    async def register_worker(self, info: WorkerInfo) -> None:
        def register(conn: sqlite3.Connection) -> None:
            conn.execute(
                SQL["register_worker"],
                {
                    "now": _clock(conn, None),
                    "id": info.id,
                    "host": info.host,
                    "pid": info.pid,
                    "queues": json.dumps(list(info.queues)),
                    "concurrency": info.concurrency,
                    "tasks": json.dumps(list(info.tasks)),
                    "beat_seconds": info.beat_seconds,
                },
            )

        await self._db.write(register)

    async def stop_worker(self, worker_id: str) -> None:
        await self._db.write(
            lambda conn: conn.execute(
                SQL["stop_worker"], {"id": worker_id, "now": _clock(conn, None)}
            )
        )

    async def list_workers(self) -> list[WorkerInfo]:
        found = await self._db.read(lambda conn: conn.execute(SQL["list_workers"]).fetchall())
        return [rows.worker(row) for row in found]

    # -- wake-ups --------------------------------------------------------

    async def wakeups(
        self, queues: Sequence[str], handoffs_for: tuple[str, str] | None = None
    ) -> AsyncIterator[Wakeup]:
        """Every queue once at the start; then enqueues (and cancels) of this
        process at once, and commits of other processes (a change of ``PRAGMA
        data_version``) within CHANGE_POLL_BUSY while commits keep coming,
        CHANGE_POLL_INTERVAL after a quiet second: every queue, and a
        CancelHint without an id (the commit may have been a cancel; the
        worker reads whether its tasks' were). The checks cost a few
        microseconds each, on this event loop."""
        subscription = wake.Subscription(self._wake_key, queues)
        try:
            watcher = connect(self.path, self._busy_timeout, self._synchronous)
        except BaseException:
            subscription.close()
            raise
        nearby: asyncio.Future[Wakeup] | None = None
        try:
            version = self._data_version(watcher)
            for queue in queues:
                yield queue
            nearby = asyncio.ensure_future(subscription.next())
            loop = asyncio.get_running_loop()
            changed_at = float("-inf")
            while True:
                busy = loop.time() - changed_at < CHANGE_BUSY_WINDOW
                await asyncio.wait(
                    {nearby}, timeout=CHANGE_POLL_BUSY if busy else CHANGE_POLL_INTERVAL
                )
                if nearby.done():
                    yield nearby.result()
                    nearby = asyncio.ensure_future(subscription.next())
                    continue
                current = self._data_version(watcher)
                if current != version:
                    version, changed_at = current, loop.time()
                    for queue in queues:
                        yield queue
                    yield CancelHint()
        finally:
            if nearby is not None:
                nearby.cancel()
            subscription.close()
            watcher.close()

    @staticmethod
    def _data_version(conn: sqlite3.Connection) -> int | None:
        try:
            version: int = conn.execute(SQL["data_version"]).fetchone()[0]
        except sqlite3.Error:
            return None  # busy or gone for a moment: compare again next time
        return version
