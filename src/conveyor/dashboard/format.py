"""How the dashboard writes values: times, spans, JSON, and the activity
chart (an SVG drawn here, so the page needs no script to show it)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from conveyor import durations
from conveyor.records import ActivityBucket

SHOWN_BYTES = 64 * 1024
"""The most of a payload, result or message body a page shows."""


span = durations.span
"""``42 s``, ``3 m 12 s``: a duration, for the templates (``fmt.span``)."""


def relative(moment: datetime | None, now: datetime) -> str:
    """``in 3 m 12 s``, ``5 s ago``, ``now``; empty for None."""
    return "" if moment is None else durations.relative(moment, now)


def stamp(moment: datetime | None) -> str:
    """A time as ``2030-01-01 12:00:05Z`` (UTC); empty for None."""
    if moment is None:
        return ""
    return f"{moment.astimezone(UTC):%Y-%m-%d %H:%M:%S}Z"


@dataclass(frozen=True, slots=True)
class Shown:
    """A JSON value as text for a page: pretty, and cut at :data:`SHOWN_BYTES`."""

    text: str
    size: int
    cut: bool


def pretty(value: Any) -> Shown:
    """``value`` as indented JSON (escaped by the template), cut to
    :data:`SHOWN_BYTES` with the full size kept for the note."""
    text = json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False, default=repr)
    encoded = text.encode()
    if len(encoded) <= SHOWN_BYTES:
        return Shown(text, len(encoded), False)
    return Shown(encoded[:SHOWN_BYTES].decode(errors="ignore"), len(encoded), True)


@dataclass(frozen=True, slots=True)
class Bar:
    x: float
    width: float
    ok_y: float
    ok_height: float
    bad_y: float
    bad_height: float
    label: str


@dataclass(frozen=True, slots=True)
class Chart:
    """The activity chart's geometry, drawn by ``_chart.html``."""

    width: int
    height: int
    top: int
    bottom: int
    left: int
    bars: list[Bar]
    ticks: list[tuple[float, str]]
    gridlines: list[tuple[float, str]]
    succeeded: int
    failed: int


def chart(buckets: list[ActivityBucket], since: datetime, bucket_seconds: int, count: int) -> Chart:
    """Stacked bars (succeeded below, failed above) for ``count`` buckets
    from ``since``, empty ones included, with a scale and time ticks."""
    width, height, left, top, bottom = 960, 220, 44, 12, 28
    by_start = {b.start: b for b in buckets}
    slot = (width - left - 8) / count
    plot = height - top - bottom
    highest = max((b.succeeded + b.failed for b in buckets), default=0)
    scale = _nice(highest)
    bars, ticks = [], []
    for n in range(count):
        start = since + timedelta(seconds=n * bucket_seconds)
        found = by_start.get(start)
        ok, bad = (found.succeeded, found.failed) if found else (0, 0)
        ok_h = plot * ok / scale
        bad_h = plot * bad / scale
        x = left + n * slot
        base = top + plot
        label = f"{start:%H:%M} UTC: {ok} succeeded, {bad} failed"
        bars.append(
            Bar(x + 1, max(slot - 2, 1), base - ok_h, ok_h, base - ok_h - bad_h, bad_h, label)
        )
        if n % max(count // 6, 1) == 0:
            ticks.append((x, f"{start:%H:%M}"))
    gridlines = [(top + plot - plot * f, f"{scale * f:g}") for f in (0, 0.5, 1)]
    return Chart(
        width,
        height,
        top,
        bottom,
        left,
        bars,
        ticks,
        gridlines,
        sum(b.succeeded for b in buckets),
        sum(b.failed for b in buckets),
    )


def _nice(value: int) -> int:
    """The smallest of 1, 2, 5 times a power of ten at or above ``value`` (at least 2)."""
    step = 1
    while True:
        for factor in (1, 2, 5):
            if step * factor >= max(value, 2):
                return step * factor
        step *= 10
