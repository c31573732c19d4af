"""PostgreSQL URLs: the connect timeout they set.

``connect_timeout`` is libpq's own URL parameter
(``postgresql://host/db?connect_timeout=10``): it bounds each connection
attempt, and conveyor also gives up opening a backend after it. Without
it, conveyor uses ``DEFAULT_CONNECT_TIMEOUT``.
"""

from __future__ import annotations

import psycopg
from psycopg.conninfo import conninfo_to_dict

from conveyor.errors import ConfigurationError
from conveyor.redaction import redact_message

DEFAULT_CONNECT_TIMEOUT = 5
"""Seconds to connect before giving up, unless the URL sets ``connect_timeout``."""


def connect_timeout(url: str) -> int:
    """The URL's ``connect_timeout`` (whole seconds, at least 2, as libpq
    counts them), else ``DEFAULT_CONNECT_TIMEOUT``."""
    try:
        value = conninfo_to_dict(url).get("connect_timeout")
    except psycopg.ProgrammingError as exc:
        # libpq's reason can quote a piece of the password.
        reason = redact_message(str(exc).strip(), url)
        raise ConfigurationError(f"invalid PostgreSQL URL: {reason}") from None
    if value is None:
        return DEFAULT_CONNECT_TIMEOUT
    try:
        seconds = int(str(value))
    except ValueError:
        raise ConfigurationError(f"connect_timeout must be whole seconds, not {value!r}") from None
    if seconds <= 0:
        raise ConfigurationError("connect_timeout must be at least 1 second")
    return max(seconds, 2)
