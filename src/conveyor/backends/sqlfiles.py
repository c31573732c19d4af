"""Named SQL blocks and numbered migrations, read from a backend's package files.

A block starts with ``-- name: NAME``; the comment lines after it say what
the statement does and why. Migrations are files named ``NNNN_what.sql`` in
the package's ``migrations`` folder. Both are our own package files, so
their text is trusted (``LiteralString``); no statement is built from input.
"""

from __future__ import annotations

import re
from importlib import resources
from typing import LiteralString

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
_MIGRATION = re.compile(r"(\d{4})_\w+\.sql")


def parse_blocks(text: str) -> dict[str, LiteralString]:
    """Split ``-- name:`` blocks; the header before the first block is ignored."""
    blocks: dict[str, LiteralString] = {}
    matches = list(_NAME.finditer(text))
    for index, match in enumerate(matches):
        end = matches[index + 1].start() if index + 1 < len(matches) else len(text)
        body = text[match.end() : end].strip()
        if match.group(1) in blocks:
            raise ValueError(f"duplicate SQL block {match.group(1)!r}")
        blocks[match.group(1)] = _without_comment_lines(body)  # our own file: trusted text
    return blocks


def _without_comment_lines(body: LiteralString) -> LiteralString:
    """The statement without its whole-line comments and indentation: they
    stay in the file for readers, and a shorter statement is one psycopg keeps
    parsed (it caches statements up to 4 KiB) instead of parsing it again at
    every execution. No string literal of ours spans lines."""
    lines = (line.strip() for line in body.splitlines())
    return "\n".join(line for line in lines if line and not line.startswith("--"))


def read_blocks(package: str, name: str) -> dict[str, LiteralString]:
    """Every named block of the file ``name`` in ``package``."""
    return parse_blocks(resources.files(package).joinpath(name).read_text(encoding="utf-8"))


def migrations(package: str) -> list[tuple[int, str, LiteralString]]:
    """The numbered migration files of ``package``, in order: (version, file name, SQL)."""
    found = []
    for entry in resources.files(package).joinpath("migrations").iterdir():
        match = _MIGRATION.fullmatch(entry.name)
        if match:
            text: LiteralString = entry.read_text(encoding="utf-8")
            found.append((int(match.group(1)), entry.name, text))
    return sorted(found)
