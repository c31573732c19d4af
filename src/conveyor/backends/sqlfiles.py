"""Named SQL blocks and numbered migrations, read from a backend's package files.

A block starts with ``-- name: NAME``; the comment lines after it say what
the statement does and why. A backend keeps its blocks in the ``sql`` folder
of its package, one file per section (``enqueue.sql``, ``attempts.sql``,
...); the names are the engine's, unique across its files. Migrations are
files named ``NNNN_what.sql`` in the package's ``migrations`` folder. Both
are our own package files, so their text is trusted (``LiteralString``); no
statement is built from input.

A block says ``{text:NAME}`` where it writes one of the texts every backend
writes alike (:data:`conveyor.backends.stored.SQL_TEXTS`): it is composed in
at load as an SQL string literal, so that the SQL and the Python code of
every backend write the very same text.
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping
from importlib import resources
from typing import LiteralString

from conveyor.backends.stored import SQL_TEXTS

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
_MIGRATION = re.compile(r"(\d{4})_\w+\.sql")
_TEXT = re.compile(r"\{text:(\w+)\}")
_COLUMN = re.compile(r"[a-z_][a-z0-9_]*")
_UNQUOTABLE = ("\x00", "\\", "{", "}", "%")
"""Characters no text of ours contains, and that would need more than a
doubled quote: NUL and backslash (escapes), braces (psycopg's ``sql.SQL``
composes the PostgreSQL statements after this) and ``%`` (psycopg's
placeholders)."""


def parse_blocks(text: str) -> dict[str, LiteralString]:
    """Split ``-- name:`` blocks; the header before the first block is ignored."""
    blocks: dict[str, LiteralString] = {}
    matches = list(_NAME.finditer(text))
    for index, match in enumerate(matches):
        end = matches[index + 1].start() if index + 1 < len(matches) else len(text)
        body = text[match.end() : end].strip()
        if match.group(1) in blocks:
            raise ValueError(f"duplicate SQL block {match.group(1)!r}")
        # Our own file and our own texts: trusted text.
        blocks[match.group(1)] = _with_texts(_without_comment_lines(body))
    return blocks


def sql_literal(text: str) -> LiteralString:
    """``text`` as a standard SQL string literal, the same for SQLite and
    PostgreSQL: in single quotes, each quote doubled. Raises ValueError for
    a text with a character that would need more (see ``_UNQUOTABLE``)."""
    if any(char in text for char in _UNQUOTABLE):
        raise ValueError(f"cannot write {text!r} as an SQL literal here")
    return "'" + text.replace("'", "''") + "'"


def sql_text(template: str) -> LiteralString:
    """A text as an SQL expression: its literal, or for a template with
    holes (``{spent}``) the concatenation of its parts with the columns the
    holes name, cast to text (as Python's ``str`` writes an integer)."""
    parts: list[LiteralString] = []
    for literal, hole, _spec, _conversion in string.Formatter().parse(template):
        if literal:
            parts.append(sql_literal(literal))
        if hole is not None:
            if not _COLUMN.fullmatch(hole):
                raise ValueError(f"the hole {{{hole}}} in {template!r} is not a column name")
            parts.append("cast(" + hole + " as text)")
    if len(parts) == 1:
        return parts[0]
    return "(" + " || ".join(parts) + ")"


def _with_texts(body: LiteralString) -> LiteralString:
    """``body`` with each ``{text:NAME}`` composed in (see the module docstring)."""

    def text(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in SQL_TEXTS:
            raise ValueError(f"unknown SQL text {{text:{name}}}")
        return sql_text(SQL_TEXTS[name])

    return _TEXT.sub(text, body)


_TRAILING_COMMENT = re.compile(r"\s+--\s[^']*$")


def _without_comment_lines(body: LiteralString) -> LiteralString:
    """The statement without its comments and indentation: they stay in the
    file for readers, and a shorter statement is one psycopg keeps parsed (it
    caches statements up to 4 KiB) instead of parsing it again at every
    execution. A comment at the end of a line goes too when it holds no
    quote (no string literal of ours holds `` -- ``, nor spans lines)."""
    lines = (_TRAILING_COMMENT.sub("", line.strip()) for line in body.splitlines())
    return "\n".join(line for line in lines if line and not line.startswith("--"))


def read_blocks(package: str, name: str) -> dict[str, LiteralString]:
    """Every named block of the file ``name`` in ``package``."""
    return parse_blocks(resources.files(package).joinpath(name).read_text(encoding="utf-8"))


def read_folder(package: str, folder: str = "sql") -> dict[str, LiteralString]:
    """Every named block of every ``.sql`` file in ``folder`` of ``package``
    (one file per section of a backend), as one mapping: a block name is the
    engine's, so a name found in two files raises ValueError, as one found
    twice in one file does."""
    blocks: dict[str, LiteralString] = {}
    found: dict[str, str] = {}
    folder_files = resources.files(package).joinpath(folder).iterdir()
    files = [entry for entry in folder_files if entry.name.endswith(".sql")]
    for entry in sorted(files, key=lambda entry: entry.name):
        for name, body in parse_blocks(entry.read_text(encoding="utf-8")).items():
            if name in blocks:
                raise ValueError(f"SQL block {name!r} in both {found[name]} and {entry.name}")
            blocks[name] = body
            found[name] = entry.name
    return blocks


PART = "part_"
"""A block named so is a part of statements, written in where they say
``{part_...}``, not a statement of its own."""


def with_parts(blocks: Mapping[str, LiteralString]) -> dict[str, LiteralString]:
    """Every statement of ``blocks`` with the parts it names (``{part_...}``)
    written in, parts within parts too (as text, before anything else is
    composed); the parts themselves are left out."""
    parts = {name: body for name, body in blocks.items() if name.startswith(PART)}
    done: dict[str, LiteralString] = {}
    for name, body in blocks.items():
        if name.startswith(PART):
            continue
        for _ in range(len(parts) + 1):
            named = [part for part in parts if "{" + part + "}" in body]
            if not named:
                break
            for part in named:
                body = body.replace("{" + part + "}", parts[part])
        else:
            raise ValueError(f"the parts of {name} name each other in a loop")
        done[name] = body
    return done


def migrations(package: str) -> list[tuple[int, str, LiteralString]]:
    """The numbered migration files of ``package``, in order: (version, file name, SQL)."""
    found = []
    for entry in resources.files(package).joinpath("migrations").iterdir():
        match = _MIGRATION.fullmatch(entry.name)
        if match:
            text: LiteralString = entry.read_text(encoding="utf-8")
            found.append((int(match.group(1)), entry.name, text))
    return sorted(found)
