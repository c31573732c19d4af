"""The array literals ``finish`` is sent (``rows._array``) read back as what they hold.

Each literal goes through the server's own array input, cast as the
statement casts it: any text (quotes, backslashes, braces, commas, the word
NULL, blanks, newlines, any Unicode PostgreSQL can store), None, floats
(infinities included) and aware timestamps must come back unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conveyor.backends.postgres.rows import _array
from tests.conftest import PG_URL

# What a PostgreSQL text can hold: no NUL, no lone surrogate.
STORABLE = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
    max_size=40,
)
TRICKY = ['"', "\\", "\\\\", '\\"', "{", "}", ",", "NULL", "null", "", " ", " a ", "a\nb", "é"]


@pytest.fixture(scope="module")
def conn() -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    with psycopg.connect(PG_URL, autocommit=True) as connection:
        yield connection


def _back(conn: psycopg.Connection[tuple[object, ...]], literal: str, cast: str) -> list[object]:
    row = conn.execute(f"select %s::{cast}", (literal,)).fetchone()
    assert row is not None
    return list(row[0])  # type: ignore[call-overload]


def test_tricky_texts_and_nulls_come_back(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    values: list[str | None] = [*TRICKY, None, *TRICKY]
    assert _back(conn, _array(values), "text[]") == values


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.one_of(st.none(), STORABLE), max_size=12))
def test_any_storable_text_comes_back(
    conn: psycopg.Connection[tuple[object, ...]], values: list[str | None]
) -> None:
    assert _back(conn, _array(values), "text[]") == values


@settings(max_examples=100, deadline=None)
@given(
    values=st.lists(
        st.one_of(st.none(), st.floats(allow_nan=False), st.integers(-(2**53), 2**53)),
        max_size=12,
    )
)
def test_numbers_come_back(
    conn: psycopg.Connection[tuple[object, ...]], values: list[float | int | None]
) -> None:
    back = _back(conn, _array(values), "float8[]")
    assert back == [None if v is None else float(v) for v in values]


def test_special_floats_and_timestamps_come_back(
    conn: psycopg.Connection[tuple[object, ...]],
) -> None:
    floats = _back(conn, _array([math.inf, -math.inf, math.nan, None]), "float8[]")
    assert floats[:2] == [math.inf, -math.inf]
    assert isinstance(floats[2], float) and math.isnan(floats[2])
    assert floats[3] is None
    moments = [
        datetime(2030, 1, 2, 3, 4, 5, 678901, tzinfo=UTC),
        datetime(2030, 6, 1, 12, 0, tzinfo=timezone(timedelta(hours=-7, minutes=-30))),
        None,
    ]
    assert _back(conn, _array(moments), "timestamptz[]") == moments
