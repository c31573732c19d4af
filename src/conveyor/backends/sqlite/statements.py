"""The SQLite backend's statements (``queries.sql``, loaded once) and its clock."""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from datetime import datetime
from typing import LiteralString

from conveyor.backends import sqlfiles
from conveyor.backends.sqlite import rows

SQL: Mapping[str, LiteralString] = sqlfiles.with_parts(
    sqlfiles.read_blocks("conveyor.backends.sqlite", "queries.sql")
)


def clock(conn: sqlite3.Connection, now: datetime | None) -> float:
    """SQLite's clock in epoch seconds, or ``now`` (tests only)."""
    value: float = conn.execute(SQL["clock"], {"now": rows.seconds(now)}).fetchone()[0]
    return value
