"""Durations and moments as people read them, for the CLI and the dashboard."""

from __future__ import annotations

from datetime import datetime

UNITS = ((86400, "d"), (3600, "h"), (60, "m"), (1, "s"))


def span(seconds: float) -> str:
    """``42 s``, ``3 m 12 s``, ``2 h 5 m``, ``4 d``: two units at most."""
    whole = round(abs(seconds))
    if whole < 60:
        return f"{whole} s"
    for i, (size, unit) in enumerate(UNITS[:-1]):
        if whole >= size:
            smaller, smaller_unit = UNITS[i + 1]
            second = whole % size // smaller
            return f"{whole // size} {unit}" + (f" {second} {smaller_unit}" if second else "")
    raise AssertionError("unreachable: a minute or more has a unit")


def relative(moment: datetime, now: datetime) -> str:
    """``in 3 m 12 s``, ``5 s ago``, ``now``."""
    seconds = (moment - now).total_seconds()
    if abs(seconds) < 1:
        return "now"
    return f"in {span(seconds)}" if seconds > 0 else f"{span(seconds)} ago"
