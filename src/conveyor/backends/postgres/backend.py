"""The PostgreSQL backend: psycopg 3, an async connection pool, LISTEN/NOTIFY.

Guarantees (see docs/guarantees.md): every statement that changes a task is
one statement, fenced by the lease token and a live lease; claims use
``FOR UPDATE SKIP LOCKED`` so concurrent workers never block on each other;
the database clock rules lease expiry. Limits: a wake-up notification is a
hint only (workers also poll), and results are stored as jsonb.

This module wires the sections, each a mixin over the shared pools
(:mod:`.pools`): :mod:`.enqueue`, :mod:`.attempts`, :mod:`.messages`,
:mod:`.controls`, :mod:`.flow`, :mod:`.workers`, :mod:`.maintenance`,
:mod:`.reads` and :mod:`.schema`; here are only opening, closing, the
capabilities and the wake-ups (:mod:`.session`, :mod:`.turns`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence

import psycopg
from psycopg import AsyncConnection
from psycopg_pool import PoolTimeout

from conveyor.backends.params import Wakeup
from conveyor.backends.postgres import statements, turns
from conveyor.backends.postgres.attempts import Attempts, heartbeat_args, heartbeat_result
from conveyor.backends.postgres.controls import Controls
from conveyor.backends.postgres.enqueue import Enqueue
from conveyor.backends.postgres.flow import FlowControl
from conveyor.backends.postgres.maintenance import Maintenance
from conveyor.backends.postgres.messages import Messages
from conveyor.backends.postgres.pools import (
    CLAIM_PLANS,
    DEFAULT_POOL_SIZE,
    DEFAULT_SCHEMA,
    SESSION,
)
from conveyor.backends.postgres.reads import Listings
from conveyor.backends.postgres.schema import Migrations
from conveyor.backends.postgres.session import Session, SessionHeartbeats, SessionTurnLock
from conveyor.backends.postgres.workers import Workers
from conveyor.backends.protocol import Capability
from conveyor.backends.refusals import one_line
from conveyor.backends.sweep import DEFAULT_SWEEP_INTERVAL, Sweep
from conveyor.errors import BackendUnavailableError, ConfigurationError
from conveyor.redaction import redact_message, redact_url

__all__ = ["DEFAULT_POOL_SIZE", "DEFAULT_SCHEMA", "PostgresBackend"]

log = logging.getLogger("conveyor.postgres")

LISTENING = frozenset({Capability.NOTIFICATIONS, Capability.TURNS, Capability.HANDOFF})
"""What needs a session of its own (LISTEN, a session advisory lock): not
declared by a backend in transaction pooling with no ``listen`` address."""


class PostgresBackend(
    Enqueue,
    Attempts,
    Messages,
    Controls,
    FlowControl,
    Workers,
    Maintenance,
    Listings,
    Migrations,
):
    """Tasks in PostgreSQL tables of one schema (default ``conveyor``).

    ``migrate`` says what :meth:`open` does about the schema: True applies
    the pending migrations (creating the schema at first use), False
    refuses a schema that is missing or behind (StoreNotReadyError), None
    only connects. Either check is one read of the migrations table; DDL
    runs only for a pending migration, so a role with the grants of
    docs/operations.md and no DDL right opens a current schema.

    The URL's ``pool_mode`` and ``listen`` (:mod:`.urls`) say whether it goes
    through a pooler in transaction mode and where wake-ups are heard; with
    no place to listen, the backend declares neither notifications, turns
    nor hand-offs, and its workers poll."""

    capabilities = frozenset(
        {
            Capability.TRANSACTIONAL_ENQUEUE,
            Capability.ATTEMPT_TRANSACTION,
            Capability.NOTIFICATIONS,
            Capability.INSPECT,
            Capability.VACUUM,
            Capability.TURNS,
            Capability.HANDOFF,
        }
    )

    def __init__(
        self,
        url: str,
        *,
        schema: str = DEFAULT_SCHEMA,
        pool_size: int = DEFAULT_POOL_SIZE,
        work_pool_size: int | None = None,
        migrate: bool | None = True,
        sweep_interval: float = DEFAULT_SWEEP_INTERVAL,
    ) -> None:
        super().__init__(url, schema=schema, pool_size=pool_size, work_pool_size=work_pool_size)
        if self.target.listen_url is None:
            self.capabilities = self.capabilities - LISTENING
        self._auto_migrate = migrate
        self._sweep = Sweep(sweep_interval)
        self._keyed_first = False
        self._keyed_active = False
        self._session_connection: Session | None = None
        self._claiming = False

    @property
    def location(self) -> str:
        return f"{redact_url(self.url)} (schema {self.schema})"

    async def open(self) -> None:
        """Connect, or raise BackendUnavailableError within the connect
        timeout with the cause in one line (the URL's password hidden).
        Then apply the pending migrations (``migrate=True``), or refuse a
        schema missing or behind (``migrate=False``: StoreNotReadyError); a
        connection lost meanwhile raises BackendUnavailableError too. No
        connection is left open when it raises (an open pool left behind
        would keep reconnecting, and hold its event loop's shutdown)."""
        if self._pool is not None:
            return
        # One connection first: a refused connection, a missing database or
        # a wrong password fails it at once, with the server's reason (a
        # pool would retry quietly until its timeout).
        try:
            probe = await AsyncConnection.connect(
                self.target.url,
                autocommit=True,
                connect_timeout=self._connect_timeout,
                prepare_threshold=None,
            )
        except psycopg.Error as exc:
            raise self._unreachable(exc) from exc
        await probe.close()
        pool = self._async_pool(1, self._configure_main, max_size=self._work_pool_size)
        try:
            await pool.open(wait=True, timeout=self._connect_timeout)
        except BaseException as exc:
            await pool.close()  # stop its reconnect attempts
            if isinstance(exc, psycopg.Error | PoolTimeout):
                raise self._unreachable(exc) from exc
            raise
        self._pool = pool
        try:
            if self.target.transaction_pooling:
                await self._check_settings()
            if self._auto_migrate is None:
                return
            if self._auto_migrate:
                await self.migrate()
            else:
                await self.require_migrated()
        except BaseException:
            await self.close()
            raise

    async def _check_settings(self) -> None:
        """Warn, through a pooler in transaction mode, of each setting of
        conveyor's sessions that the server's side does not give."""
        missing = await self.missing_settings()
        if missing:
            log.warning(
                "through a pooler in transaction mode conveyor sets nothing on a session, "
                "and the server's sessions lack: %s (set them in the pooler's connect_query "
                "or with ALTER ROLE ... SET; see docs/scaling.md)",
                ", ".join(missing),
            )

    def _unreachable(self, exc: BaseException) -> BackendUnavailableError:
        reason = redact_message(one_line(str(exc)), self.url)
        return BackendUnavailableError(f"cannot connect to {redact_url(self.url)}: {reason}")

    async def close(self) -> None:
        session, self._session_connection = self._session_connection, None
        self._claiming = False
        if session is not None:
            await session.close()
        pools = [p for p in (self._claim_pool, self._transaction_pool, self._pool) if p is not None]
        self._claim_pool = self._transaction_pool = self._pool = None
        for pool in pools:
            await self._close_pool(pool)
        with self._sync_lock:
            sync_pool, self._sync_pool = self._sync_pool, None
        if sync_pool is not None:
            await asyncio.to_thread(sync_pool.close)

    def _session(self) -> Session:
        """The session connection (see :mod:`.session`), made at first use
        on the listen address."""
        if self.target.listen_url is None:
            raise ConfigurationError(
                "this URL goes through a pooler in transaction mode with no listen address: "
                "add listen=HOST:PORT to listen past it"
            )
        if self._session_connection is None:
            self._session_connection = Session(
                self.target.listen_url,
                f"{SESSION}; {CLAIM_PLANS}".encode(),
                self.channel,
                statements.cancel_channel(self.schema),
                statements.turn_channel(self.schema),
            )
        return self._session_connection

    def _claim_session(self) -> Session | None:
        """A worker's backend of one work connection claims on its session
        connection, where there is one: claims and completions then never
        wait for each other (see :mod:`.pools`)."""
        if self._work_pool_size != 1 or self.target.listen_url is None:
            return None
        session = self._session()
        if not self._claiming:
            self._claiming = True
            session.acquire()  # until the backend closes
        return session

    def session_heartbeats(self) -> SessionHeartbeats | None:
        """The heartbeats on the session connection, for the worker's
        heartbeat thread (see :mod:`.session`); None where the backend has
        no session connection (a pooler in transaction mode with no listen
        address: heartbeats go through the pooler, on a backend of their own)."""
        if self.target.listen_url is None:
            return None
        return SessionHeartbeats(
            self._session(), self.sql["heartbeat"], heartbeat_args, heartbeat_result
        )

    def turn_lock(self, kind: str) -> SessionTurnLock:
        """The wake-up turn of the workers of ``kind`` (see :mod:`.turns`),
        on the session connection."""
        return self._session().turn_lock(
            self.sql["turn_take"], self.sql["turn_give"], turns.kind_key(kind)
        )

    def wakeups(
        self, queues: Sequence[str], handoffs_for: tuple[str, str] | None = None
    ) -> AsyncIterator[Wakeup]:
        """Queue names from the wake-up channel, cancel hints (task ids) from
        the cancel channel, hand-offs to ``handoffs_for`` from its own, on
        the session connection (see :mod:`.session`)."""
        return self._session().wakeups(queues, handoffs_for)
