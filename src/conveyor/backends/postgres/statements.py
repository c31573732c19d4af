"""Load the named SQL blocks of the ``sql`` folder and compose the schema in.

A block starts with ``-- name: NAME``; the comment lines after it say what
the statement does and why. Each file of ``sql/`` holds one section of the
backend (``enqueue.sql``, ``attempts.sql``, ...); the names are global to the
engine. Statements are composed once per backend with the validated schema
identifier, its wake-up channel and the parts they name, and kept as bytes,
ready to execute (and to be prepared server-side by psycopg after a few
executions).

What the blocks say:

- ``{schema}`` is the validated schema identifier, composed in once at load,
  ``{channel}`` the schema's wake-up channel for pg_notify (a string
  literal), ``{cancel_channel}`` the one for cancels of running tasks,
  ``{turn_channel}`` the one a wake-up turn given back is told on, and
  ``{lock_space}`` the first key of the schema's advisory locks (an integer).
- A block named ``part_*`` is not a statement: it is composed in once at
  load where a statement of any file says ``{part_...}``, for text that
  several statements share.
- ``{text:NAME}`` is a text every backend writes alike (an error type or
  message of the attempt log, :data:`conveyor.backends.stored.SQL_TEXTS`),
  composed in first as an SQL literal; one with holes reads the columns they
  name.
- ``%(now)s`` is NULL in production: the database clock is the only
  authority on lease expiry; tests pass a time to move the clock without
  sleeping. The clock is ``statement_timestamp()``, not ``now()``: inside a
  long transaction (an attempt's own transaction) ``now()`` would be the
  stale transaction start.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Mapping
from typing import LiteralString

from psycopg import sql

from conveyor.backends import sqlfiles
from conveyor.errors import ConfigurationError

SCHEMA_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,39}$")


def validate_schema(schema: str) -> str:
    """Return ``schema`` if it is a safe identifier, else raise ConfigurationError."""
    if not SCHEMA_NAME.fullmatch(schema):
        raise ConfigurationError(
            f"invalid schema name {schema!r}: use 1-40 lowercase letters, digits or _, "
            "not starting with a digit"
        )
    return schema


_BLOCKS = sqlfiles.read_folder(__package__ or "conveyor.backends.postgres")


def compose(template: LiteralString, schema: str) -> bytes:
    """Compose ``{schema}`` into one statement."""
    composed = sql.SQL(template).format(schema=sql.Identifier(validate_schema(schema)))
    return composed.as_bytes(None)


def channel(schema: str) -> str:
    """The LISTEN/NOTIFY channel of ``schema``'s wake-ups (the triggers of the
    migrations name it the same way): each payload is a queue name."""
    return f"conveyor_{validate_schema(schema)}"


def cancel_channel(schema: str) -> str:
    """The channel that tells workers a running task's cancel was requested:
    each payload is a task id."""
    return f"{channel(schema)}_cancel"


def turn_channel(schema: str) -> str:
    """The channel that tells waiting workers a wake-up turn was given
    back: each payload is the turn's key (see :mod:`.session`)."""
    return f"{channel(schema)}_turn"


def lock_space(schema: str) -> int:
    """The first key of ``schema``'s two-key advisory locks: a signed 32-bit
    integer drawn from the schema name, the same in every process."""
    return zlib.crc32(f"conveyor.{validate_schema(schema)}".encode()) - 2**31


def load(schema: str) -> Mapping[str, bytes]:
    """Every statement of the ``sql`` folder, composed for ``schema`` (with its
    wake-up ``{channel}``, ``{cancel_channel}`` and advisory ``{lock_space}``)
    and its parts."""
    names = {
        "schema": sql.Identifier(validate_schema(schema)),
        "channel": sql.Literal(channel(schema)),
        "cancel_channel": sql.Literal(cancel_channel(schema)),
        "turn_channel": sql.Literal(turn_channel(schema)),
        "lock_space": sql.Literal(lock_space(schema)),
    }
    return {
        name: sql.SQL(body).format(**names).as_bytes(None)
        for name, body in sqlfiles.with_parts(_BLOCKS).items()
    }


def migrations() -> list[tuple[int, str, LiteralString]]:
    """The numbered migration files, in order: (version, file name, SQL)."""
    return sqlfiles.migrations(__package__ or "conveyor.backends.postgres")
