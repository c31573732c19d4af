"""The shared texts of the attempt log, composed into the SQL statements."""

from __future__ import annotations

from importlib import resources

import pytest

from conveyor.backends import sqlfiles
from conveyor.backends.postgres import statements as pg_statements
from conveyor.backends.stored import SQL_TEXTS

PACKAGES = ["conveyor.backends.postgres", "conveyor.backends.sqlite"]


def test_a_text_becomes_a_quoted_sql_literal() -> None:
    assert sqlfiles.sql_literal("lease expired") == "'lease expired'"
    assert sqlfiles.sql_literal("it's") == "'it''s'"
    for unsafe in ("a\\b", "a\x00b", "a{b", "a}b", "50%"):
        with pytest.raises(ValueError, match="SQL literal"):
            sqlfiles.sql_literal(unsafe)


def test_a_template_becomes_a_concatenation_of_its_columns() -> None:
    assert sqlfiles.sql_text("spent ({spent} of {max_attempts})") == (
        "('spent (' || cast(spent as text) || ' of ' || cast(max_attempts as text) || ')')"
    )
    with pytest.raises(ValueError, match="column"):
        sqlfiles.sql_text("{Spent}")


def test_an_unknown_text_is_refused_at_load() -> None:
    with pytest.raises(ValueError, match="unknown SQL text"):
        sqlfiles.parse_blocks("-- name: x\nselect {text:nothing_of_ours};")


@pytest.mark.parametrize("package", PACKAGES)
def test_the_sql_files_name_the_texts_and_never_copy_them(package: str) -> None:
    files = resources.files(package).joinpath("sql").iterdir()
    raw = "\n".join(f.read_text(encoding="utf-8") for f in files if f.name.endswith(".sql"))
    composed = "\n".join(sqlfiles.read_folder(package).values())
    assert "{text:" in raw
    assert "{text:" not in composed
    for text in SQL_TEXTS.values():
        first = text.split("{", 1)[0]  # a template's text up to its first hole
        assert first not in raw, f"{package} copies {first!r} instead of naming it"
    for name in ("lease_expired_error", "corrupt_task_error"):
        assert sqlfiles.sql_literal(SQL_TEXTS[name]) in composed


def test_postgres_statements_load_with_the_texts() -> None:
    statements = pg_statements.load("conveyor")
    assert sqlfiles.sql_literal(SQL_TEXTS["lease_expired"]).encode() in statements["claim_reclaim"]
    assert b"cast(spent as text)" in statements["quarantine"]
