"""Structured logging for the worker and the CLI.

conveyor logs through the standard ``logging`` module under the
``conveyor`` logger; task-related records carry ``task_id`` and
``attempt`` in their ``extra``. ``configure_logging("json")`` prints one
JSON object per record with those fields, for log pipelines.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

_FIELDS = ("task_id", "attempt", "worker_id")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message and task fields."""

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "time": self.formatTime(record),
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


def configure_logging(style: str = "text", level: str = "INFO") -> None:
    """Send conveyor's logs to stderr as text or JSON lines."""
    handler = logging.StreamHandler(sys.stderr)
    if style == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("conveyor")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
