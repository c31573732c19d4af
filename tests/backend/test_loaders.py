"""conveyor's timestamp loaders (PostgreSQL): out-of-range values read as
the nearest end of ``datetime``'s range, and in-range ones as fast as
psycopg's own loader reads them."""

from __future__ import annotations

import struct
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from psycopg.pq import Format

from conveyor.backends.postgres.loaders import (
    ADAPTERS,
    EARLIEST,
    LATEST,
    BoundedTimestamptzBinaryLoader,
    BoundedTimestamptzLoader,
)
from tests.conftest import PG_URL

OID = psycopg.adapters.types["timestamptz"].oid


@pytest.mark.parametrize(
    ("bounded", "fmt"),
    [(BoundedTimestamptzLoader, Format.TEXT), (BoundedTimestamptzBinaryLoader, Format.BINARY)],
)
def test_the_bounded_loaders_call_psycopg_s_own(bounded: type, fmt: Format) -> None:
    """A subclass of psycopg's Python loader ran its pure Python code, about
    six times slower than the C loader psycopg's binary package registers
    (which cannot be subclassed): two timestamps of every claimed task, a
    few microseconds each. The bounded loaders call the registered one."""
    registered = psycopg.adapters.get_loader(OID, fmt)
    loader = bounded(OID, None)
    assert type(loader._load.__self__) is registered


@pytest.mark.parametrize("binary", [False, True], ids=["text", "binary"])
async def test_out_of_range_timestamps_read_as_the_nearest_end(binary: bool) -> None:
    async with await psycopg.AsyncConnection.connect(PG_URL, context=ADAPTERS) as conn:
        cursor = conn.cursor(binary=binary)
        await cursor.execute(
            "select 'infinity'::timestamptz, '-infinity'::timestamptz,"
            " '4000-01-01 BC'::timestamptz, '2020-01-01 12:00+02'::timestamptz"
        )
        row = await cursor.fetchone()
    assert row is not None
    assert row[:3] == (LATEST, EARLIEST, EARLIEST)
    assert row[3] == datetime(2020, 1, 1, 10, tzinfo=UTC)


def test_a_binary_timestamp_past_datetime_s_range_reads_as_its_end() -> None:
    loader = BoundedTimestamptzBinaryLoader(OID, None)
    year_294276 = struct.pack(">q", 2**62)
    assert loader.load(year_294276) == LATEST
    assert loader.load(struct.pack(">q", -(2**62))) == EARLIEST
    postgres_epoch = datetime(2000, 1, 1, tzinfo=UTC)
    assert loader.load(struct.pack(">q", 86_400_000_000)) == postgres_epoch + timedelta(days=1)
