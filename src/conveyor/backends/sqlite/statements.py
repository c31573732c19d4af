"""The SQLite backend's statements (the ``sql`` folder, loaded once) and its clock.

Each file of ``sql/`` holds one section of the backend (``enqueue.sql``,
``attempts.sql``, ...) as named blocks; the names are global to the engine,
and a ``part_*`` block is composed in where a statement of any file names it.

Every write runs inside BEGIN IMMEDIATE: SQLite has one writer at a time,
and taking the write lock first (waiting up to busy_timeout for it) means a
transaction never has to upgrade a read lock, which could fail at once with
SQLITE_BUSY. With one writer there is nothing to skip: no SKIP LOCKED.

``:now`` is the clock of the transaction, read once from SQLite by ``clock``
(tests pass a time to move it without sleeping). Lists travel as JSON arrays
and are unpacked with json_each. ``{text:NAME}`` is a text every backend
writes alike (an error type of the attempt log,
:data:`conveyor.backends.stored.SQL_TEXTS`), composed in at load as an SQL
literal; the messages come from the same module as parameters.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from datetime import datetime
from typing import LiteralString

from conveyor.backends import sqlfiles
from conveyor.backends.sqlite import rows

SQL: Mapping[str, LiteralString] = sqlfiles.with_parts(
    sqlfiles.read_folder("conveyor.backends.sqlite")
)


def clock(conn: sqlite3.Connection, now: datetime | None) -> float:
    """SQLite's clock in epoch seconds, or ``now`` (tests only)."""
    value: float = conn.execute(SQL["clock"], {"now": rows.seconds(now)}).fetchone()[0]
    return value
