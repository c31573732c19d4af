"""How conveyor's connections read timestamps: never failing on one.

PostgreSQL's ``timestamptz`` holds ±infinity and years up to 294276, which
Python's ``datetime`` cannot; psycopg's own loader then raises, and one such
value (written around conveyor) would make every listing that shows its
row fail. conveyor's connections read such a value as the earliest or
latest ``datetime`` instead (UTC). The adapters are conveyor's own: an
application's connections are left as they are.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg.abc import AdaptContext
from psycopg.adapt import AdaptersMap, Loader
from psycopg.pq import Format

EARLIEST = datetime.min.replace(tzinfo=UTC)
LATEST = datetime.max.replace(tzinfo=UTC)

_TIMESTAMPTZ = psycopg.adapters.types["timestamptz"].oid


def _bound(before: bool) -> datetime:
    return EARLIEST if before else LATEST


def _psycopg_load(oid: int, context: AdaptContext | None, fmt: Format) -> Callable[[Any], Any]:
    """The ``load`` of psycopg's own ``timestamptz`` loader in ``fmt``: its C
    one where psycopg's binary or C package is installed (about six times
    faster than the pure Python one, which a subclass would inherit), and
    which cannot be subclassed. The bounded loaders call it, then catch."""
    loader = psycopg.adapters.get_loader(_TIMESTAMPTZ, fmt)
    if loader is None:  # pragma: no cover - psycopg always registers both
        raise RuntimeError(f"psycopg has no timestamptz loader in {fmt.name} format")
    load: Callable[[Any], Any] = loader(oid, context).load
    return load


class _BoundedLoader(Loader):
    """psycopg's ``timestamptz`` loader in this class's ``format``; a value it
    refuses (out of ``datetime``'s range) reads as :meth:`_nearest_end`."""

    def __init__(self, oid: int, context: AdaptContext | None = None) -> None:
        super().__init__(oid, context)
        self._load = _psycopg_load(oid, context, self.format)

    def load(self, data: Any) -> datetime:
        try:
            value: datetime = self._load(data)
        except psycopg.DataError:
            return self._nearest_end(bytes(data))
        return value

    def _nearest_end(self, data: bytes) -> datetime:
        raise NotImplementedError


class BoundedTimestamptzLoader(_BoundedLoader):
    """Text ``timestamptz``; out of ``datetime``'s range: its nearest end."""

    format = Format.TEXT

    def _nearest_end(self, data: bytes) -> datetime:
        return _bound(data.startswith(b"-") or data.endswith(b"BC"))


class BoundedTimestamptzBinaryLoader(_BoundedLoader):
    """Binary ``timestamptz``; out of ``datetime``'s range: its nearest end."""

    format = Format.BINARY

    def _nearest_end(self, data: bytes) -> datetime:
        return _bound(int.from_bytes(data, "big", signed=True) < 0)


ADAPTERS = AdaptersMap(psycopg.adapters)
"""psycopg's adapters with the bounded timestamp loaders: pass as ``context``."""
ADAPTERS.register_loader("timestamptz", BoundedTimestamptzLoader)
ADAPTERS.register_loader("timestamptz", BoundedTimestamptzBinaryLoader)
