"""How a store's error reads when conveyor passes it on: one short line.

A store's message may carry what it was given: a row (PostgreSQL's
``DETAIL``), a trigger's source (``CONTEXT``), a value of megabytes, a
newline that would forge a log line. Each engine's classifier keeps the
primary message only and passes it through :func:`one_line`.
"""

from __future__ import annotations

MAX_REFUSAL = 300
"""The most characters of a store's message that an error keeps."""


def one_line(text: str, limit: int = MAX_REFUSAL) -> str:
    """``text`` on one line of at most about ``limit`` characters: lines
    joined by ``; ``, other unprintable characters escaped, the rest cut
    (saying so). Costs what ``limit`` allows, whatever the text's size."""
    head = text[: limit + 1]
    joined = "; ".join(line.strip() for line in head.splitlines() if line.strip())
    shown = "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in joined)
    if len(shown) <= limit and len(text) <= limit:
        return shown
    return shown[:limit].rstrip() + f"... [{len(text)} characters in all]"
