"""Concurrency keys and rate limits on Redis: what ``list_keys.lua`` returns,
as :class:`~conveyor.records.KeyInfo`.

The design is in ``lua/lib/flow.lua`` (and the layout in :mod:`.keys`): a row
per key with pending tasks (or a refilling rate bucket), each key's due
tasks in a sorted set of their own (out of their queues' ready sets), and
its running tasks by lease expiry, so that a claim reads a full key's row
and never the tasks queued behind it. The memory store is the model.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from conveyor.backends.redis import rows
from conveyor.errors import BackendError
from conveyor.records import KeyInfo


def listed(found: Sequence[Any], limit: int) -> list[KeyInfo]:
    """The reply of ``list_keys.lua`` (``{now, rows...}``): the keys by key,
    at most ``limit``, with when each rate's next token comes (None while one
    is there). A row that does not read raises BackendError."""
    now = rows.moment(int(found[0]))
    keys = sorted(found[1:], key=lambda row: str(row[0]))[: max(limit, 0)]
    return [_key_info(row, now) for row in keys]


def _key_info(row: Sequence[Any], now: Any) -> KeyInfo:
    key, max_running, running, pending, rate, period, tokens = row
    try:
        rate_limit = int(rate) if rate != "" else None
        rate_period = float(period) if period != "" else None
        left = float(tokens) if tokens != "" else None
        upcoming = None
        if left is not None and left < 1 and rate_limit and rate_period:
            upcoming = now + timedelta(seconds=(1 - left) * rate_period / rate_limit)
        return KeyInfo(
            key,
            int(max_running),
            int(running),
            int(pending),
            rate_limit,
            rate_period,
            left,
            upcoming,
        )
    except ValueError:
        raise BackendError(f"concurrency key {key!r} is corrupt in Redis: {row!r}") from None
