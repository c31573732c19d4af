"""Apply the numbered migrations of the PostgreSQL schema, once each.

Every migration runs in its own transaction together with its record in
``{schema}.migrations``, under a transaction-scoped advisory lock keyed by the
schema name, so workers starting at once apply each migration exactly once
and a failed migration leaves nothing half-done. Re-running is a no-op.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from psycopg import AsyncClientCursor, AsyncConnection, sql
from psycopg.rows import tuple_row

from conveyor.backends.postgres.queries import compose, migrations
from conveyor.backends.protocol import Migration

log = logging.getLogger("conveyor.migrate")

_PREPARE = (
    "create schema if not exists {schema}",
    """create table if not exists {schema}.migrations (
        version integer primary key,
        name text not null,
        applied_at timestamptz not null default now())""",
)


async def apply_migrations(conn: AsyncConnection[object], schema: str) -> list[int]:
    """Bring ``schema`` up to date on ``conn`` (autocommit); return versions applied."""
    applied: list[int] = []
    lock_key = f"conveyor.migrate.{schema}"
    for version, name, text in migrations():
        async with conn.transaction():
            await conn.execute("select pg_advisory_xact_lock(hashtext(%s))", (lock_key,))
            for statement in _PREPARE:
                await conn.execute(compose(statement, schema))
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


async def pending_migrations(
    conn: AsyncConnection[object], schema: str, statements: Mapping[str, bytes]
) -> list[Migration]:
    """The migrations ``schema`` still needs, each as a script that applies
    it in one transaction with its record, as :func:`apply_migrations` would."""
    cursor: AsyncClientCursor[tuple[Any, ...]] = AsyncClientCursor(conn, row_factory=tuple_row)
    await cursor.execute(statements["migrations_table_exists"], {"schema": schema})
    row = await cursor.fetchone()
    applied: set[int] = set()
    if row is not None and row[0]:
        await cursor.execute(statements["applied_migrations"])
        applied = {int(r[0]) for r in await cursor.fetchall()}
    prepare = "".join(compose(s, schema).decode() + ";\n" for s in _PREPARE)
    found = []
    for version, name, text in migrations():
        if version in applied:
            continue
        record = cursor.mogrify(statements["record_migration"], {"version": version, "name": name})
        body = compose(text, schema).decode().rstrip()
        found.append(Migration(version, name, f"begin;\n{prepare}{body}\n{record}\ncommit;\n"))
    return found
