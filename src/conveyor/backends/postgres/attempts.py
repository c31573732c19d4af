"""The attempt lifecycle on PostgreSQL: claim (with the reclaim of expired
leases and the quarantine of tasks at their attempt limit), heartbeat,
finish, the cancels requested of running tasks, and an attempt's own
transaction.

A mixin of :class:`~conveyor.backends.postgres.backend.PostgresBackend`.
Every statement that changes a task is fenced by the lease token and a
live lease (see sql/attempts.sql); claims use ``FOR UPDATE SKIP LOCKED``
on the claims' own pool, so concurrent workers never block on each other.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg
from psycopg import AsyncConnection, AsyncCursor

from conveyor.backends.params import (
    ClaimedTask,
    ClaimParams,
    FinishParams,
    FinishResult,
    HeartbeatParams,
    HeartbeatResult,
    ProgressParams,
)
from conveyor.backends.postgres.failures import translated
from conveyor.backends.postgres.messages import applied, has_effects, record_with_effects, spawning
from conveyor.backends.postgres.pools import Pools
from conveyor.backends.postgres.rows import finish_statement
from conveyor.backends.postgres.transactions import (
    PostgresSyncTransaction,
    PostgresTransaction,
    Session,
)
from conveyor.backends.stored import CLAIM_COLUMNS, Unread, claimed_rows, claimed_task, key_scan
from conveyor.backends.sweep import Sweep
from conveyor.model import LeaseToken

log = logging.getLogger("conveyor.postgres")

# A handler's own statements, in its attempt transaction, are planned as the
# server would plan them for any client: the session's planner settings
# (NO_SEQSCAN, see .pools) are conveyor's, not the handler's. conveyor's own
# statements at the end of the transaction take them back
# (transactions.ATTEMPT_END).
BEGIN_ATTEMPT = "begin isolation level read committed; set local enable_seqscan to default"
BEGIN_UNBOUND_ATTEMPT = (
    "begin isolation level read committed; set local idle_in_transaction_session_timeout to 0;"
    " set local enable_seqscan to default"
)


class Attempts(Pools):
    """``claim``, ``heartbeat``, ``finish``, ``cancel_requested`` and the
    attempt transactions (see :class:`~conveyor.backends.protocol.Backend`
    and :class:`~conveyor.backends.capabilities.AttemptTransactions`)."""

    _sweep: Sweep
    _keyed_first: bool
    """Whether the last claim took keyed tasks first (claims alternate)."""
    _keyed_active: bool
    """Whether keyed tasks were waiting at the last look (see ``_claim``)."""

    async def claim(self, params: ClaimParams) -> list[ClaimedTask]:
        """Claims run on the claim pool, where each statement is prepared at
        once and planned once per connection. PostgreSQL would otherwise plan
        the claim anew at every execution: a generic plan knows nothing of
        the arrays and limit it gets, and guesses it costlier than a plan for
        one queue and a known limit. Planning cost more than running the
        claim (a third of a millisecond, on every claim). The generic plans
        are the ones the plan guard tests check."""
        if params.limit <= 0 or not params.names or not params.queues:
            return []
        args = {
            "now": params.now,
            "worker_id": params.worker_id,
            "names": list(params.names),
            "queues": list(params.queues),
            "limit": params.limit,
            "lease": params.lease,
            "inbox_names": list(params.inbox_names),
        }
        with self._sweep.turn() as sweep:
            return await self._claim(params, args, sweep)

    async def _claim(
        self, params: ClaimParams, args: Mapping[str, Any], sweep: bool
    ) -> list[ClaimedTask]:
        session = self._claim_session()
        if session is not None:
            try:
                rows = await session.run(lambda conn: self._claim_rows(conn, params, args, sweep))
            except psycopg.Error as exc:
                raise translated(exc) from exc
        else:
            async with self._connection(await self.claim_pool()) as conn:
                rows = await self._claim_rows(conn, params, args, sweep)
        worker = params.worker_id
        claimed, unread = claimed_rows(rows, lambda row: claimed_task(row, worker), worker)
        if unread:
            await self._set_aside(worker, unread)
        return claimed

    async def _claim_rows(
        self,
        conn: AsyncConnection[Any],
        params: ClaimParams,
        args: Mapping[str, Any],
        sweep: bool,
    ) -> list[tuple[Any, ...]]:
        """The rows one claim takes, on ``conn``."""
        if sweep:
            quarantined = await (await conn.execute(self.sql["quarantine"], args)).fetchall()
            if quarantined:
                log.error(
                    "failed %d tasks whose attempt counters stand at their limit: %s",
                    len(quarantined),
                    ", ".join(str(r[0]) for r in quarantined),
                )
            # Expired leases that may not run again end first, in a
            # statement of their own: the dependents and parents their
            # ends make due are this claim's to take (see end_expired).
            await conn.execute(self.sql["end_expired"], args)
        statement = self.sql["claim_reclaim" if sweep else "claim"]
        # While keyed tasks wait, plain and keyed tasks take turns at being
        # claimed first: neither kind can keep a busy worker from the other.
        self._keyed_first = keyed_first = self._keyed_active and not self._keyed_first
        rows = await self._claim_keyed(conn, args, params.limit) if keyed_first else []
        if len(rows) < params.limit:
            left = {**args, "limit": params.limit - len(rows)}
            # Rows in binary: their timestamps load without text parsing.
            plain = await (await conn.execute(statement, left, binary=True)).fetchall()
            # claim says whether keys wait in its last column; claim_reclaim does not.
            waiting: bool | None = None
            if not sweep:
                waiting = bool(plain[0][-1])
                plain = [row[:-1] for row in plain if row[0] is not None]
            else:  # the claimed rows whole: a claim's columns, then three more
                plain = [row[:CLAIM_COLUMNS] for row in plain]
            # Keys are looked for when they were seen last time, when the
            # plain claim comes back short, and at each sweep: a keyed
            # task waits at most a poll interval behind a plain backlog.
            look = self._keyed_active or sweep or len(plain) < left["limit"]
            rows += plain
            if not keyed_first and look and len(rows) < params.limit:
                rows += await self._claim_keyed(conn, args, params.limit - len(rows), waiting)
        return rows

    async def _set_aside(self, worker_id: str, unread: Sequence[Unread]) -> None:
        """Claimed rows that do not read end ``failed`` (``CorruptTask``),
        each fenced by its token, so that the rest of the claim runs and they
        are not claimed again. Never raises: a row left as it is waits out
        its lease."""
        failures = [c for c in (bad.completion() for bad in unread) if c is not None]
        if not failures:
            return
        try:
            await self.finish(FinishParams(worker_id, failures))
        except Exception as exc:
            log.error("claimed rows that do not read were not set aside: %s", exc)

    async def _claim_keyed(
        self,
        conn: AsyncConnection[Any],
        args: Mapping[str, Any],
        limit: int,
        waiting: bool | None = None,
    ) -> list[tuple[Any, ...]]:
        """Claim up to ``limit`` tasks with concurrency keys, if any key has
        pending tasks (``waiting``, when the plain claim said; else asked
        here): in one transaction, lock key rows, then claim (see
        ``lock_keys`` and ``claim_keyed`` in sql/flow.sql)."""
        if not self._keyed_active:
            if waiting is None:
                found = await (await conn.execute(self.sql["keys_waiting"])).fetchone()
                waiting = bool(found and found[0])
            self._keyed_active = waiting
            if not waiting:
                return []
        async with conn.transaction():
            scan = {"key_scan": key_scan(limit)}
            locked = await (await conn.execute(self.sql["lock_keys"], scan)).fetchall()
            keys = [row[0] for row in locked]
            if not keys:
                # No key row, or every one held by another claim: look again
                # when the probe says so.
                self._keyed_active = False
                return []
            keyed = {**args, "keys": keys, "limit": limit}
            claimed = await conn.execute(self.sql["claim_keyed"], keyed, binary=True)
            return await claimed.fetchall()

    async def heartbeat(self, params: HeartbeatParams) -> HeartbeatResult:
        return heartbeat_result(params, await self._fetchall("heartbeat", heartbeat_args(params)))

    async def report_progress(self, params: ProgressParams) -> frozenset[LeaseToken]:
        reports = list(params.reports)
        if not reports:
            return frozenset()
        rows = await self._fetchall(
            "report_progress",
            {
                "now": params.now,
                "worker_id": params.worker_id,
                "ids": [r.token.task_id for r in reports],
                "attempts": [r.token.attempt for r in reports],
                "progress": [r.text for r in reports],
            },
        )
        stored = {(int(r[0]), int(r[1])) for r in rows}
        return frozenset(r.token for r in reports if (r.token.task_id, r.token.attempt) in stored)

    async def cancel_requested(
        self, worker_id: str, tokens: Sequence[LeaseToken]
    ) -> frozenset[LeaseToken]:
        if not tokens:
            return frozenset()
        args = {
            "worker_id": worker_id,
            "ids": [t.task_id for t in tokens],
            "attempts": [t.attempt for t in tokens],
        }
        found = {(int(r[0]), int(r[1])) for r in await self._fetchall("cancel_requested", args)}
        return frozenset(t for t in tokens if (t.task_id, t.attempt) in found)

    async def finish(self, params: FinishParams) -> FinishResult:
        completions = list(params.completions)
        if not completions:
            return FinishResult(frozenset(), frozenset())
        async with self._connection() as conn:
            done = await self._finish_on(conn, params)
        tokens = [c.token for c in completions]
        return FinishResult(
            applied=frozenset(t for t in tokens if (t.task_id, t.attempt) in done),
            rejected=frozenset(t for t in tokens if (t.task_id, t.attempt) not in done),
        )

    async def _finish_on(
        self, conn: AsyncConnection[Any], params: FinishParams
    ) -> set[tuple[int, int]]:
        """The (task, attempt) pairs whose completions ``conn`` recorded."""
        completions = list(params.completions)
        if has_effects(completions):
            if spawning(completions):
                async with conn.transaction():
                    finished = await record_with_effects(
                        conn, self.sql, params.worker_id, completions, params.now
                    )
            else:
                finished = await self._record_piped(conn, params)
            return await applied(finished)
        name, args = finish_statement(params.worker_id, completions, params.now)
        rows = await (await conn.execute(self.sql[name], args)).fetchall()
        return {(int(r[0]), int(r[1])) for r in rows}

    async def _record_piped(
        self,
        conn: AsyncConnection[Any],
        params: FinishParams,
    ) -> AsyncCursor[Any] | None:
        """Completions with effects in one pipeline from BEGIN to COMMIT: BEGIN
        goes out with the guard and the locks, COMMIT with the effects and the
        finish, two round trips in all. (psycopg's ``transaction()`` syncs the
        pipeline as it enters and as it leaves: two more.) The finish's rows
        are read after the commit: the transaction has failed if a holder of
        its lease is missing from them (``fence_check``)."""
        try:
            async with conn.pipeline():
                await conn.execute(b"begin")
                finished = await record_with_effects(
                    conn, self.sql, params.worker_id, params.completions, params.now
                )
                await conn.execute(b"commit")
            return finished
        except BaseException:
            # A failed statement skipped the COMMIT: the transaction is still open.
            with contextlib.suppress(psycopg.Error):
                await conn.rollback()
            raise

    async def begin_attempt_transaction(self, worker_id: str) -> PostgresTransaction:
        pool = await self.transaction_pool()
        conn = await pool.getconn()
        try:
            await conn.execute(BEGIN_UNBOUND_ATTEMPT)
        except BaseException:
            await pool.putconn(conn)
            raise
        return PostgresTransaction(self, pool, conn, worker_id)

    def begin_attempt_transaction_sync(self, worker_id: str) -> PostgresSyncTransaction:
        """Through a pooler in transaction mode, the server session's limit on
        idle transactions (the pooler's ``connect_query`` gives every session
        conveyor's) is lifted for the attempt, as the async attempt's is, and
        the session's process id is asked of the server: the one the pooler
        gave the client is its own, and ending that process would end another
        client's session, or none."""
        conn = self.sync_pool.getconn()
        try:
            if self.target.transaction_pooling:
                # The pid the client knows is the bouncer's: ask the server,
                # and for when the transaction began (see ``abandon``).
                conn.execute(BEGIN_UNBOUND_ATTEMPT)
                found = conn.execute("select pg_backend_pid(), now()").fetchone()
                assert found is not None
                session = Session(int(found[0]), found[1])
            else:
                conn.execute(BEGIN_ATTEMPT)
                session = Session(conn.info.backend_pid, None)
        except BaseException:
            self.sync_pool.putconn(conn)
            raise
        return PostgresSyncTransaction(self, conn, worker_id, session)


def heartbeat_args(params: HeartbeatParams) -> dict[str, Any]:
    """The arguments of the ``heartbeat`` statement."""
    tokens = list(params.tokens)
    return {
        "now": params.now,
        "worker_id": params.worker_id,
        "ids": [t.task_id for t in tokens],
        "attempts": [t.attempt for t in tokens],
        "lease": params.lease,
    }


def heartbeat_result(params: HeartbeatParams, rows: Sequence[Sequence[Any]]) -> HeartbeatResult:
    """What the ``heartbeat`` statement's rows say of ``params.tokens``."""
    tokens = list(params.tokens)
    # A row without a task is there only when the worker is not registered.
    by_token = {(int(r[0]), int(r[1])): r for r in rows if r[0] is not None}
    live = {t for t in tokens if by_token[(t.task_id, t.attempt)][2]}
    return HeartbeatResult(
        renewed=frozenset(t for t in live if by_token[(t.task_id, t.attempt)][3]),
        lost=frozenset(tokens) - live,
        cancel_requested=frozenset(t for t in live if by_token[(t.task_id, t.attempt)][4]),
        registered=len(by_token) == len(rows),
    )
