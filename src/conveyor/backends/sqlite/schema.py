"""The SQLite schema: its numbered migrations, applied once each and recorded.

Each migration runs in one ``BEGIN IMMEDIATE`` transaction together with its
record in ``conveyor_migrations``: SQLite's DDL is transactional, and the
write lock makes processes starting at once apply each migration exactly
once. A failed migration leaves nothing half-done. Re-running is a no-op.

:class:`Schema` is the section of
:class:`~conveyor.backends.sqlite.backend.SQLiteBackend` that migrates,
checks and drops the store.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import urllib.parse
from collections.abc import Iterator, Mapping
from typing import LiteralString

from conveyor.backends import sqlfiles
from conveyor.backends.sqlite.database import Database, immediate, translated_errors
from conveyor.backends.sqlite.statements import SQL
from conveyor.errors import StoreNotReadyError
from conveyor.records import Migration
from conveyor.redaction import redact_url

log = logging.getLogger("conveyor.migrate")

_PACKAGE = "conveyor.backends.sqlite"


def statements(script: LiteralString) -> Iterator[LiteralString]:
    """Split a script into complete statements (a trigger body stays whole)."""
    pending: LiteralString = ""
    for line in script.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            yield pending
            pending = ""
    if any(line.strip() and not line.lstrip().startswith("--") for line in pending.splitlines()):
        raise ValueError(f"incomplete statement at the end of a migration: {pending!r}")


def apply_migrations(conn: sqlite3.Connection, sql: Mapping[str, LiteralString]) -> list[int]:
    """Bring the file up to date on ``conn`` (autocommit mode); return versions applied."""
    applied: list[int] = []
    pending = sqlfiles.migrations(_PACKAGE)
    if _up_to_date(conn, sql, pending[-1][0]):
        return applied  # a read only: no write lock needed to start a worker
    conn.execute(sql["migrations_table"])
    for version, name, script in pending:
        with immediate(conn):
            if conn.execute(sql["migration_applied"], {"version": version}).fetchone():
                continue
            for statement in statements(script):
                conn.execute(statement)
            conn.execute(sql["record_migration"], {"version": version, "name": name})
        log.info("applied migration %s", name)
        applied.append(version)
    return applied


def _up_to_date(conn: sqlite3.Connection, sql: Mapping[str, LiteralString], latest: int) -> bool:
    if conn.execute(sql["migrations_table_exists"]).fetchone() is None:
        return False
    row = conn.execute(sql["latest_migration"]).fetchone()
    return row is not None and row[0] is not None and row[0] >= latest


def require_migrated(
    conn: sqlite3.Connection, sql: Mapping[str, LiteralString], where: str
) -> None:
    """Raise StoreNotReadyError unless every migration is recorded in the
    file (``where`` names it in the message). Reads only."""
    if conn.execute(sql["migrations_table_exists"]).fetchone() is None:
        raise StoreNotReadyError(f"no conveyor store in {where}: run `conveyor migrate`")
    applied = {int(r[0]) for r in conn.execute(sql["applied_migrations"])}
    behind = [m for m in sqlfiles.migrations(_PACKAGE) if m[0] not in applied]
    if behind:
        raise StoreNotReadyError(
            f"the conveyor store in {where} lacks {len(behind)} migration(s), "
            f"{behind[0][1]} first: run `conveyor migrate`"
        )


def pending_migrations(
    conn: sqlite3.Connection, sql: Mapping[str, LiteralString]
) -> list[Migration]:
    """The migrations the file still needs, each as a script that applies it
    in one transaction with its record, as :func:`apply_migrations` would."""
    applied: set[int] = set()
    if conn.execute(sql["migrations_table_exists"]).fetchone() is not None:
        applied = {int(r[0]) for r in conn.execute(sql["applied_migrations"])}
    prepare = sql["migrations_table"].strip().rstrip(";") + ";\n"
    found = []
    for version, name, script in sqlfiles.migrations(_PACKAGE):
        if version in applied:
            continue
        record = sql["record_migration_script"].strip().format(version=version, name=name)
        text = f"begin immediate;\n{prepare}{script.rstrip()}\n{record}\ncommit;\n"
        found.append(Migration(version, name, text))
    return found


class Schema:
    """``migrate``, ``require_migrated``, ``pending_migrations`` and
    ``destroy`` (see :class:`~conveyor.backends.protocol.Backend`), and the
    store's ``location``."""

    path: str
    _busy_timeout: float
    _db: Database

    @property
    def location(self) -> str:
        return redact_url(f"sqlite:///{self.path}")

    async def migrate(self) -> list[int]:
        return await self._db.read(lambda conn: apply_migrations(conn, SQL))

    async def require_migrated(self) -> None:
        await self._db.read(lambda conn: require_migrated(conn, SQL, self.location))

    async def pending_migrations(self) -> list[Migration]:
        return await self._db.read(lambda conn: pending_migrations(conn, SQL))

    def _require_file(self) -> None:
        """Raise StoreNotReadyError unless the file exists with every
        migration applied (read on a connection of its own, read-only)."""
        if not os.path.exists(self.path):
            raise StoreNotReadyError(
                f"no SQLite database at {self.path} (check --url or CONVEYOR_URL; "
                "`conveyor migrate` or a worker creates it)"
            )
        with translated_errors():
            conn = sqlite3.connect(
                f"file:{urllib.parse.quote(self.path)}?mode=ro",
                uri=True,
                timeout=self._busy_timeout,
            )
            try:
                require_migrated(conn, SQL, self.location)
            finally:
                conn.close()

    async def destroy(self) -> None:
        def drop(conn: sqlite3.Connection) -> None:
            for table in (
                "message_keys",
                "messages",
                "attempts",
                "workers",
                "dependencies",
                "ending",
                "tasks",
                "migrations",
            ):
                conn.execute(SQL[f"drop_{table}"])

        await self._db.write(drop)
