"""Apply the numbered migrations of the PostgreSQL schema, once each.

Every migration runs in its own transaction together with its record in
``{schema}.migrations``, under a transaction-scoped advisory lock keyed by the
schema name, so workers starting at once apply each migration exactly once
and a failed migration leaves nothing half-done. Re-running is a no-op.

The migrations table is read first, in one query that runs no DDL: a
current schema is never written to, so roles with only the rights of
docs/operations.md (no CREATE) open it. Only a pending migration takes the
lock and runs DDL; the schema is created only when it does not exist (a
schema made beforehand by an administrator, owned by the migrating role,
needs no CREATE on the database).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import psycopg
from psycopg import AsyncClientCursor, AsyncConnection, sql
from psycopg.rows import tuple_row

from conveyor.backends.postgres.pools import Pools
from conveyor.backends.postgres.statements import compose, migrations
from conveyor.errors import StoreNotReadyError
from conveyor.records import Migration
from conveyor.redaction import redact_url

log = logging.getLogger("conveyor.migrate")

_PREPARE = (
    "create schema if not exists {schema}",
    """create table if not exists {schema}.migrations (
        version integer primary key,
        name text not null,
        applied_at timestamptz not null default now())""",
)


async def applied_versions(
    conn: AsyncConnection[Any], statements: Mapping[str, bytes]
) -> set[int] | None:
    """The versions recorded in the schema's migrations table; None when
    there is no such table, or no such schema. One query, no DDL: a missing
    table is told by the error the select raises (``conn`` in autocommit, so
    the error ends nothing but the statement)."""
    try:
        cursor = await conn.execute(statements["applied_migrations"])
    except (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName):
        return None
    return {int(row[0]) for row in await cursor.fetchall()}


def missing(applied: set[int] | None) -> list[tuple[int, str, Any]]:
    """The migrations not in ``applied`` (every one when None), in order."""
    return [m for m in migrations() if applied is None or m[0] not in applied]


async def apply_migrations(
    conn: AsyncConnection[Any], schema: str, statements: Mapping[str, bytes]
) -> list[int]:
    """Bring ``schema`` up to date on ``conn`` (autocommit); return versions
    applied. A current schema costs one read and is not written to."""
    found = await applied_versions(conn, statements)
    pending = missing(found)
    applied: list[int] = []
    lock_key = f"conveyor.migrate.{schema}"
    prepare = found is None
    for version, name, text in pending:
        async with conn.transaction():
            await conn.execute("select pg_advisory_xact_lock(hashtext(%s))", (lock_key,))
            if prepare:
                await _prepare(conn, schema)
                prepare = False
            done = await conn.execute(
                sql.SQL("select 1 from {} where version = %s").format(
                    sql.Identifier(schema, "migrations")
                ),
                (version,),
            )
            if await done.fetchone():
                continue
            await conn.execute(compose(text, schema))
            await conn.execute(
                sql.SQL("insert into {} (version, name) values (%s, %s)").format(
                    sql.Identifier(schema, "migrations")
                ),
                (version, name),
            )
            log.info("applied migration %s to schema %s", name, schema)
            applied.append(version)
    return applied


async def _prepare(conn: AsyncConnection[Any], schema: str) -> None:
    """Create the schema, if it does not exist, and its migrations table
    (under the migration lock: another process may have just made them)."""
    cursor = await conn.execute("select to_regnamespace(%s) is null", (schema,))
    row = await cursor.fetchone()
    if row is not None and row[0]:
        await conn.execute(compose(_PREPARE[0], schema))
    await conn.execute(compose(_PREPARE[1], schema))


async def require_migrated(
    conn: AsyncConnection[Any], statements: Mapping[str, bytes], where: str
) -> None:
    """Raise StoreNotReadyError unless every migration is recorded (``where``
    names the store in the message). One query; writes nothing."""
    found = await applied_versions(conn, statements)
    if found is None:
        raise StoreNotReadyError(f"no conveyor store in {where}: run `conveyor migrate`")
    behind = missing(found)
    if behind:
        raise StoreNotReadyError(
            f"the conveyor store in {where} lacks {len(behind)} migration(s), "
            f"{behind[0][1]} first: run `conveyor migrate`"
        )


async def pending_migrations(
    conn: AsyncConnection[Any], schema: str, statements: Mapping[str, bytes]
) -> list[Migration]:
    """The migrations ``schema`` still needs, each as a script that applies
    it in one transaction with its record, as :func:`apply_migrations` would."""
    cursor: AsyncClientCursor[tuple[Any, ...]] = AsyncClientCursor(conn, row_factory=tuple_row)
    applied = await applied_versions(conn, statements) or set()
    prepare = "".join(compose(s, schema).decode() + ";\n" for s in _PREPARE)
    found = []
    for version, name, text in migrations():
        if version in applied:
            continue
        record = cursor.mogrify(statements["record_migration"], {"version": version, "name": name})
        body = compose(text, schema).decode().rstrip()
        found.append(Migration(version, name, f"begin;\n{prepare}{body}\n{record}\ncommit;\n"))
    return found


class Migrations(Pools):
    """``migrate``, ``require_migrated``, ``pending_migrations`` and
    ``destroy`` (see :class:`~conveyor.backends.protocol.Backend`): the
    functions above, on a connection of the backend's pool."""

    async def migrate(self) -> list[int]:
        async with self._connection() as conn:
            return await apply_migrations(conn, self.schema, self.sql)

    async def require_migrated(self) -> None:
        async with self._connection() as conn:
            await require_migrated(
                conn, self.sql, f'schema "{self.schema}" at {redact_url(self.url)}'
            )

    async def destroy(self) -> None:
        async with self.pool.connection() as conn:
            await conn.execute(compose("drop schema if exists {schema} cascade", self.schema))

    async def pending_migrations(self) -> list[Migration]:
        async with self._connection() as conn:
            return await pending_migrations(conn, self.schema, self.sql)
