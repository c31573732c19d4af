"""Load the named SQL blocks of ``queries.sql`` and compose the schema in.

A block starts with ``-- name: NAME``; the comment lines after it say what
the statement does and why. Statements are composed once per backend with
the validated schema identifier and kept as bytes, ready to execute (and to
be prepared server-side by psycopg after a few executions).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from importlib import resources
from typing import LiteralString

from psycopg import sql

from conveyor.errors import ConfigurationError

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
SCHEMA_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,39}$")


def validate_schema(schema: str) -> str:
    """Return ``schema`` if it is a safe identifier, else raise ConfigurationError."""
    if not SCHEMA_NAME.fullmatch(schema):
        raise ConfigurationError(
            f"invalid schema name {schema!r}: use 1-40 lowercase letters, digits or _, "
            "not starting with a digit"
        )
    return schema


def parse_blocks(text: str) -> dict[str, LiteralString]:
    """Split ``-- name:`` blocks; the header before the first block is ignored."""
    blocks: dict[str, LiteralString] = {}
    matches = list(_NAME.finditer(text))
    for index, match in enumerate(matches):
        end = matches[index + 1].start() if index + 1 < len(matches) else len(text)
        body = text[match.end() : end].strip()
        if match.group(1) in blocks:
            raise ValueError(f"duplicate SQL block {match.group(1)!r}")
        blocks[match.group(1)] = body  # from our own package file: trusted text
    return blocks


def _read(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


_BLOCKS = parse_blocks(_read("queries.sql"))


def compose(template: LiteralString, schema: str) -> bytes:
    """Compose ``{schema}`` into one statement."""
    composed = sql.SQL(template).format(schema=sql.Identifier(validate_schema(schema)))
    return composed.as_bytes(None)


def load(schema: str) -> Mapping[str, bytes]:
    """Every statement of ``queries.sql``, composed for ``schema``."""
    return {name: compose(body, schema) for name, body in _BLOCKS.items()}


def migrations() -> list[tuple[int, str, LiteralString]]:
    """The numbered migration files, in order: (version, file name, SQL)."""
    found = []
    folder = resources.files(__package__).joinpath("migrations")
    for entry in folder.iterdir():
        match = re.fullmatch(r"(\d{4})_\w+\.sql", entry.name)
        if match:
            text: LiteralString = entry.read_text(encoding="utf-8")
            found.append((int(match.group(1)), entry.name, text))
    return sorted(found)
