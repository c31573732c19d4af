"""conveyor's log format: ISO times, task fields, the driver's lines routed."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest

from conveyor.logs import RepeatFilter, configure_logging


@pytest.fixture(autouse=True)
def restore_loggers() -> Iterator[None]:
    names = ("conveyor", "psycopg")
    saved = {n: (logging.getLogger(n).handlers[:], logging.getLogger(n).level) for n in names}
    yield
    for name, (handlers, level) in saved.items():
        logger = logging.getLogger(name)
        logger.handlers[:], logger.level, logger.propagate = handlers, level, True


def test_json_lines_carry_iso_utc_times_and_task_fields(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("json", "info")
    logging.getLogger("conveyor.worker").info(
        "task %s done", "x", extra={"task_id": 7, "task_name": "x", "duration": 0.25}
    )
    [record] = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert datetime.fromisoformat(record["time"]).utcoffset() == timedelta(0)
    assert (record["task_id"], record["task_name"], record["duration"]) == (7, "x", 0.25)


def test_the_driver_lines_are_routed_and_their_repeats_dropped(
    capsys: pytest.CaptureFixture[str],
) -> None:
    configure_logging("json", "INFO")
    pool = logging.getLogger("psycopg.pool")
    for address in ("0x7f01", "0x7f02", "0x7f03"):
        pool.warning("discarding closed connection: <Connection at %s>", address)
    pool.info("below WARNING: not shown")
    pool.warning("error connecting in 'pool': refused")
    records = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert [(r["logger"], r["message"]) for r in records] == [
        ("psycopg.pool", "discarding closed connection: <Connection at 0x7f01>"),
        ("psycopg.pool", "error connecting in 'pool': refused"),
    ]


def test_a_repeat_is_let_through_again_after_the_window() -> None:
    repeats = RepeatFilter(window=0.0)
    record = logging.LogRecord("psycopg", logging.WARNING, __file__, 1, "same", None, None)
    assert repeats.filter(record) and repeats.filter(record)
    fresh = RepeatFilter()
    assert fresh.filter(record) and not fresh.filter(record)


def test_an_unknown_level_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown log level 'LOUD': one of DEBUG, INFO"):
        configure_logging("text", "LOUD")


def test_text_lines_escape_control_characters_but_newlines(
    capsys: pytest.CaptureFixture[str],
) -> None:
    configure_logging("text", "INFO")
    logging.getLogger("conveyor.worker").error(
        "task failed (ValueError: %s)\n%s", "\x1b]0;title\x07 \x9b31m \u202e", "Traceback\n\tx"
    )
    err = capsys.readouterr().err
    assert err.endswith(
        "task failed (ValueError: \\x1b]0;title\\x07 \\x9b31m \\u202e)\nTraceback\n\tx\n"
    )
