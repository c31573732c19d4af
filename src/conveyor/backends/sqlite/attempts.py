"""The attempt lifecycle on SQLite: claim, heartbeat, finish, and the
reclaim and set-aside a claim does on its way.

:class:`Attempts` is the section of
:class:`~conveyor.backends.sqlite.backend.SQLiteBackend` that runs it. A
claim is one write transaction: it ends the expired leases it finds (and,
on its sweep's turn, fails the tasks whose counters stand at the limit),
picks the next tasks in claim order and logs their attempts, so a claim
and its reclaims commit together or not at all. SQLite's clock rules
lease expiry.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Sequence
from typing import Any

from conveyor.backends import wake
from conveyor.backends.params import (
    ClaimedTask,
    ClaimParams,
    FinishParams,
    FinishResult,
    HeartbeatParams,
    HeartbeatResult,
    ProgressParams,
)
from conveyor.backends.sqlite import rows
from conveyor.backends.sqlite.database import Database
from conveyor.backends.sqlite.flow import keyed_candidates, served, settle_keys
from conveyor.backends.sqlite.messages import apply_effects, holding, rewake
from conveyor.backends.sqlite.statements import SQL, clock
from conveyor.backends.stored import (
    LEASE_EXPIRED,
    claimed_rows,
    corrupt_counter_message,
    lease_lost_message,
)
from conveyor.backends.sweep import Sweep
from conveyor.model import LeaseToken, TaskState

log = logging.getLogger("conveyor.sqlite")


class Attempts:
    """``claim``, ``heartbeat``, ``cancel_requested`` and ``finish`` (see
    :class:`~conveyor.backends.protocol.Backend`)."""

    _db: Database
    _sweep: Sweep
    _wake_key: str

    async def claim(self, params: ClaimParams) -> list[ClaimedTask]:
        if params.limit <= 0 or not params.names or not params.queues:
            return []
        moved: list[bool] = []
        with self._sweep.turn() as sweep:
            claimed = await self._db.write(lambda conn: self._claim(conn, params, sweep, moved))
        if any(moved):
            # An end released or ended dependents (or a cancelled
            # coroutine's children) in queues this claim may not serve.
            wake.notify_all(self._wake_key)
        return claimed

    def _claim(
        self, conn: sqlite3.Connection, params: ClaimParams, sweep: bool, moved: list[bool]
    ) -> list[ClaimedTask]:
        """The claim's transaction; ``moved`` gets, for each task it ended,
        whether that end may have moved other tasks."""
        now = clock(conn, params.now)
        params = served(conn, params)
        scope = {
            "now": now,
            "queues": json.dumps(list(params.queues)),
            "names": json.dumps(list(params.names)),
        }
        if sweep:
            moved += self._quarantine(conn, params, scope)
        ended = conn.execute(SQL["end_expired"], scope).fetchall()
        moved += [bool(row[4]) for row in ended]
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
                    for task_id, state, spent, max_attempts, _moves in ended
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
                moved.append(self._set_aside(conn, bad.token, bad.why, now))
        return claimed

    @staticmethod
    def _set_aside(conn: sqlite3.Connection, token: LeaseToken, why: str, now: float) -> bool:
        """A claimed row that does not read ends failed in the claim's own
        transaction, its attempt saying why (``CorruptTask``): the rest of
        the claim runs. Whether the task has dependents."""
        ended = conn.execute(SQL["quarantine_end"], {"task_id": token.task_id, "now": now})
        awaited = any(row[0] for row in ended.fetchall())
        args = {"task_id": token.task_id, "number": token.attempt, "now": now, "message": why}
        conn.execute(SQL["quarantine_log"], {**args, "worker_id": token.worker_id})
        return awaited

    @staticmethod
    def _quarantine(
        conn: sqlite3.Connection, params: ClaimParams, scope: dict[str, Any]
    ) -> list[bool]:
        """End failed the tasks whose counters stand at the limit (see
        ``quarantine_find`` in sql/attempts.sql), saying why in their attempt
        log; for each, whether it has dependents."""
        # Read them all first: each update below takes its row out of the
        # index the query walks.
        stuck = conn.execute(SQL["quarantine_find"], scope).fetchall()
        awaited = []
        for task_id, attempt, spent, state in stuck:
            ended = conn.execute(SQL["quarantine_end"], {"task_id": task_id, "now": scope["now"]})
            awaited.append(any(row[0] for row in ended.fetchall()))
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
        return awaited

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
            now = clock(conn, params.now)
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

    async def report_progress(self, params: ProgressParams) -> frozenset[LeaseToken]:
        reports = list(params.reports)
        if not reports:
            return frozenset()
        given = json.dumps([[r.token.task_id, r.token.attempt, r.text] for r in reports])

        def store(conn: sqlite3.Connection) -> list[Any]:
            now = clock(conn, params.now)
            args = {"now": now, "worker_id": params.worker_id, "reports": given}
            return conn.execute(SQL["report_progress"], args).fetchall()

        stored = {(int(r[0]), int(r[1])) for r in await self._db.write(store)}
        return frozenset(r.token for r in reports if (r.token.task_id, r.token.attempt) in stored)

    async def finish(self, params: FinishParams) -> FinishResult:
        completions = list(params.completions)
        if not completions:
            return FinishResult(frozenset(), frozenset())

        parents: list[int | None] = []
        due: set[str] = set()
        moved = False  # an end moved dependents, or a coroutine's children

        effects = [c for c in completions if c.effects is not None]

        def record(conn: sqlite3.Connection) -> set[tuple[int, int]]:
            now = clock(conn, params.now)
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
            nonlocal moved
            parents.extend(r[2] for r in found)
            due.update(r[3] for r in found if r[4])
            moved = any(r[5] for r in found)
            done = {(r[0], r[1]) for r in found}
            applied = [c for c in completions if (c.token.task_id, c.token.attempt) in done]
            if applied:
                conn.execute(
                    SQL["finish_log"], {"now": now, "completions": rows.completions_json(applied)}
                )
                rewake(conn, applied, now)
            return done

        done = await self._db.write(record)
        if effects or moved or any(p for p in parents):
            # Sends, spawns, a child's end and a dependency's end woke tasks
            # the queues of which this process does not know: every local
            # worker looks.
            wake.notify_all(self._wake_key)
        elif due:  # a workflow's next step, a release, a key's freed slot
            wake.notify(self._wake_key, due)
        tokens = [c.token for c in completions]
        applied = frozenset(t for t in tokens if (t.task_id, t.attempt) in done)
        return FinishResult(applied=applied, rejected=frozenset(tokens) - applied)

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
