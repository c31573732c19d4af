"""How conveyor's connections read timestamps: never failing on one.

PostgreSQL's ``timestamptz`` holds ±infinity and years up to 294276, which
Python's ``datetime`` cannot; psycopg's own loader then raises, and one such
value (written around conveyor) would make every listing that shows its
row fail. conveyor's connections read such a value as the earliest or
latest ``datetime`` instead (UTC). The adapters are conveyor's own: an
application's connections are left as they are.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg.adapt import AdaptersMap
from psycopg.types.datetime import TimestamptzBinaryLoader, TimestamptzLoader

EARLIEST = datetime.min.replace(tzinfo=UTC)
LATEST = datetime.max.replace(tzinfo=UTC)


def _bound(before: bool) -> datetime:
    return EARLIEST if before else LATEST


class BoundedTimestamptzLoader(TimestamptzLoader):
    """Text ``timestamptz``; out of ``datetime``'s range: its nearest end."""

    def load(self, data: Any) -> datetime:
        try:
            return super().load(data)
        except psycopg.DataError:
            text = bytes(data)
            return _bound(text.startswith(b"-") or text.endswith(b"BC"))


class BoundedTimestamptzBinaryLoader(TimestamptzBinaryLoader):
    """Binary ``timestamptz``; out of ``datetime``'s range: its nearest end."""

    def load(self, data: Any) -> datetime:
        try:
            return super().load(data)
        except psycopg.DataError:
            micros = int.from_bytes(bytes(data), "big", signed=True)
            return _bound(micros < 0)


ADAPTERS = AdaptersMap(psycopg.adapters)
"""psycopg's adapters with the bounded timestamp loaders: pass as ``context``."""
ADAPTERS.register_loader("timestamptz", BoundedTimestamptzLoader)
ADAPTERS.register_loader("timestamptz", BoundedTimestamptzBinaryLoader)
