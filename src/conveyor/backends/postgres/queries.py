"""Load the named SQL blocks of ``queries.sql`` and compose the schema in.

A block starts with ``-- name: NAME``; the comment lines after it say what
the statement does and why. Statements are composed once per backend with
the validated schema identifier and the parts they name, and kept as bytes,
ready to execute (and to be prepared server-side by psycopg after a few
executions).
"""

from __future__ import annotations

import re
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


_BLOCKS = sqlfiles.read_blocks(__package__ or "conveyor.backends.postgres", "queries.sql")


def compose(template: LiteralString, schema: str) -> bytes:
    """Compose ``{schema}`` into one statement."""
    composed = sql.SQL(template).format(schema=sql.Identifier(validate_schema(schema)))
    return composed.as_bytes(None)


PART = "part_"
"""A block named so is a part of statements, composed in where they say
``{part_...}``, not a statement of its own."""


def load(schema: str) -> Mapping[str, bytes]:
    """Every statement of ``queries.sql``, composed for ``schema`` with its parts."""
    identifier = sql.Identifier(validate_schema(schema))
    parts = {
        name: sql.SQL(body).format(schema=identifier)
        for name, body in _BLOCKS.items()
        if name.startswith(PART)
    }
    return {
        name: sql.SQL(body).format(schema=identifier, **parts).as_bytes(None)
        for name, body in _BLOCKS.items()
        if not name.startswith(PART)
    }


def migrations() -> list[tuple[int, str, LiteralString]]:
    """The numbered migration files, in order: (version, file name, SQL)."""
    return sqlfiles.migrations(__package__ or "conveyor.backends.postgres")
