"""Structured logging for the worker and the CLI.

conveyor logs through the standard ``logging`` module under the
``conveyor`` logger; task-related records carry ``task_id``, ``attempt``,
``task_name`` and ``duration`` in their ``extra``.
``configure_logging("json")`` prints one JSON object per record with those
fields and an ISO 8601 UTC ``time``, for log pipelines.

The database drivers' own loggers (``psycopg``, its pool ``psycopg.pool``)
are routed through the same handler and format, at WARNING and above
(everything at DEBUG): during a database outage their lines are part of
the story, in the same shape as the rest. A driver line that repeats one
of the last ``REPEAT_WINDOW`` seconds (the pool retrying a connection, its
addresses aside) is dropped: the worker itself says once per change that
the store is away.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import threading
import time
from datetime import UTC, datetime
from typing import Any

from conveyor.terminal import shown

LEVELS = ["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]
ROUTED = ("psycopg",)
"""Loggers of libraries conveyor uses that are sent through its handler."""
_FIELDS = ("task_id", "attempt", "task_name", "duration", "worker_id")
REPEAT_WINDOW = 60.0
_ADDRESSES = re.compile(r"0x[0-9a-f]+")


class RepeatFilter(logging.Filter):
    """Drops a record whose message (memory addresses aside) was let through
    by this filter less than ``window`` seconds ago."""

    def __init__(self, window: float = REPEAT_WINDOW) -> None:
        super().__init__()
        self.window = window
        self._seen: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, _ADDRESSES.sub("0x", record.getMessage()))
        now = time.monotonic()
        with self._lock:
            last = self._seen.get(key)
            if last is not None and now - last < self.window:
                return False
            if len(self._seen) > 1000:  # forget the old ones: a bounded memory
                self._seen = {k: t for k, t in self._seen.items() if now - t < self.window}
            self._seen[key] = now
        return True


def iso_time(record: logging.LogRecord) -> str:
    """The record's time in ISO 8601, UTC, to the millisecond."""
    return datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message and task fields."""

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "time": iso_time(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in _FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                data[name] = value
        if record.exc_info:
            data["exception"] = self.formatException(record.exc_info)
        return json.dumps(data, default=str)


class TextFormatter(logging.Formatter):
    """``TIME LEVEL LOGGER: MESSAGE``, the time in ISO 8601 UTC.

    A record quotes text from outside (a handler's error message and
    traceback, a task name): control characters but newlines and tabs are
    escaped (:func:`conveyor.terminal.shown`), so no ESC or OSC sequence in
    it reaches the terminal. Limits: a newline in that text still starts a
    line of its own (a traceback is printed as a block)."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        return shown(super().format(record), block=True)

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return iso_time(record)


def configure_logging(style: str = "text", level: str = "INFO") -> None:
    """Send conveyor's logs (and its database drivers') to stderr as text or
    JSON lines. ``level`` is one of :data:`LEVELS` (any case); anything else
    raises ValueError."""
    name = level.upper()
    if name not in LEVELS:
        raise ValueError(f"unknown log level {level!r}: one of {', '.join(LEVELS)}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if style == "json" else TextFormatter())
    root = logging.getLogger("conveyor")
    root.handlers[:] = [handler]
    root.setLevel(name)
    root.propagate = False
    # A handler of their own: a filter on a handler sees the records of
    # child loggers (psycopg.pool) too, one on a logger would not.
    drivers = logging.StreamHandler(sys.stderr)
    drivers.setFormatter(handler.formatter)
    drivers.addFilter(RepeatFilter())
    for routed in ROUTED:
        driver = logging.getLogger(routed)
        driver.handlers[:] = [drivers]
        driver.setLevel(name if name == "DEBUG" else max(root.level, logging.WARNING))
        driver.propagate = False
