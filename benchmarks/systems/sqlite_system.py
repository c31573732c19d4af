"""What the systems on a SQLite file share: the file a URL names, and one
row read through a read-only connection that holds no lock between reads."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from conveyor.backends import sqlite_path

READ_TIMEOUT = 10.0
"""Seconds a read waits for a writer's lock."""


def path_of(url: str) -> str:
    """The file of a ``sqlite:///`` URL."""
    path = sqlite_path(url)
    if path is None:
        raise ValueError(f"not a SQLite URL: {url!r}")
    return path


def read_row(url: str, query: str, params: Sequence[Any] = ()) -> tuple[Any, ...]:
    """One row of ``query``, through a read-only connection to the file of
    ``url``, opened and closed around it: it holds no lock between polls
    (with a rollback journal a reader's shared lock would hold up a
    committing worker)."""
    uri = f"{Path(path_of(url)).as_uri()}?mode=ro"
    with contextlib.closing(sqlite3.connect(uri, uri=True, timeout=READ_TIMEOUT)) as conn:
        row: tuple[Any, ...] = conn.execute(query, tuple(params)).fetchone()
    return row
