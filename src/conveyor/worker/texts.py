"""Error texts cut to size before anything else touches them.

A handler may raise an exception whose message is tens of megabytes, full
of NUL characters or lone surrogates. Everything here is bounded by the
limit, not by the input: the text is cut first and only the cut part is
cleaned, so an enormous error costs the worker no more than a small one.
A traceback is bounded the same way in depth and breadth (frames walked,
chained causes, members of exception groups): see :func:`format_traceback`.
"""

from __future__ import annotations

import traceback as tb_module
from collections import deque
from types import FrameType, TracebackType

from conveyor.model import qualified_name

MAX_ERROR_MESSAGE = 4_000
MAX_TRACEBACK = 32_000
CUT_NOTE = 40
"""Characters reserved for the ``... [N characters cut]`` note."""


def storable(text: str) -> str:
    """``text`` as any backend can store it: no NUL, no lone surrogate.

    Linear in ``text``: call it on text already cut to size."""
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def cut(text: str, limit: int) -> str:
    """At most ``limit`` storable characters of ``text``, saying how many were cut.

    Cut first, then cleaned: the cost depends on ``limit`` only."""
    if len(text) <= limit:
        clean = storable(text)
        if len(clean) <= limit:
            return clean
    kept = storable(text[: limit - CUT_NOTE])[: limit - CUT_NOTE]
    return kept + f"... [{len(text) - len(kept)} characters cut]"


type_name = qualified_name
"""How an error's type is stored: ``ValueError`` for builtins, else
``module.QualifiedName``."""


def reason(exc: BaseException) -> str:
    """A one-line reason for a log: the error's text, or its type where the
    text is empty (a timeout's is)."""
    text = describe(exc)
    if not text and isinstance(exc, TimeoutError):
        return "no answer in time (TimeoutError)"
    return cut(text, MAX_ERROR_MESSAGE) if text else type_name(type(exc))


def describe(exc: BaseException) -> str:
    """``str(exc)``, or something readable when that raises."""
    try:
        return str(exc)
    except BaseException:
        try:
            return repr(exc)
        except BaseException:
            return f"<{type(exc).__name__} whose str() and repr() raise>"


FRAMES_KEPT = 20
"""Frames shown at each end of a traceback; those between are counted, not shown."""
FRAMES_WALKED = 10_000
"""Frames of one traceback walked at most: a deeper one (a handler that
raised the recursion limit) shows its first frames and the last walked,
and says that it goes on."""
CHAIN_KEPT = 16
"""Exceptions of a chain (causes, contexts) shown at most, the last raised
first kept; the older ones are left out, and not walked."""
GROUP_KEPT = 8
"""Members of an exception group shown at most (the rest are counted)."""
GROUP_DEPTH = 3
"""Exception groups nested within each other shown at most."""
EXCEPTIONS_KEPT = 64
"""Exceptions formatted at most for one error, in every chain and group."""
NOTES_KEPT = 4
"""Notes (``add_note``) shown at most per exception."""


class Budget:
    """What formatting one error may walk; counts what it did (for tests)."""

    def __init__(self) -> None:
        self.frames = 0
        """Traceback entries visited."""
        self.exceptions = 0
        """Exceptions formatted."""


def format_traceback(exc: BaseException, limit: int, budget: Budget | None = None) -> str:
    """The traceback of ``exc`` (with its causes), at most ``limit`` characters.

    The work is bounded whatever the error is: at most ``FRAMES_WALKED``
    frames of each traceback are walked and ``2 * FRAMES_KEPT`` of them
    formatted (the first and the last, with a count of those between), at
    most ``CHAIN_KEPT`` chained exceptions, ``GROUP_KEPT`` members of a
    group and ``EXCEPTIONS_KEPT`` exceptions in all; each message is cut
    before it is copied. Source lines are read as the traceback module
    reads them (``linecache``)."""
    counted = budget if budget is not None else Budget()
    out = _Text(limit)
    try:
        _format(exc, counted, out, "", 0)
    except _Full:
        pass
    except BaseException:
        return f"{type(exc).__name__}: (traceback unavailable)"
    text = "".join(out.pieces)
    if out.size <= limit:
        return cut(text, limit)
    kept = storable(text[: limit - CUT_NOTE])[: limit - CUT_NOTE]
    return kept + "... [the rest cut]"


class _Full(Exception):
    """The text has reached its limit: formatting stops."""


class _Text:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.pieces: list[str] = []
        self.size = 0

    def add(self, piece: str) -> None:
        left = self.limit + 1 - self.size
        self.pieces.append(piece[:left])
        self.size += min(len(piece), left)
        if self.size > self.limit:
            raise _Full


def _chain(exc: BaseException) -> tuple[list[tuple[BaseException, str]], bool]:
    """``exc`` and the exceptions it was raised from (cause, else context
    unless suppressed), oldest first, each with the line that joins it to
    the next; at most ``CHAIN_KEPT``; and whether older ones were left out."""
    chain: list[tuple[BaseException, str]] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    joint = ""
    while current is not None and id(current) not in seen:
        if len(chain) == CHAIN_KEPT:
            return chain[::-1], True
        seen.add(id(current))
        chain.append((current, joint))
        if current.__cause__ is not None:
            current, joint = current.__cause__, CAUSE
        elif current.__context__ is not None and not current.__suppress_context__:
            current, joint = current.__context__, CONTEXT
        else:
            current = None
    return chain[::-1], False


CAUSE = "\nThe above exception was the direct cause of the following exception:\n\n"
CONTEXT = "\nDuring handling of the above exception, another exception occurred:\n\n"


def _format(exc: BaseException, budget: Budget, out: _Text, margin: str, depth: int) -> None:
    chain, older = _chain(exc)
    if older:
        out.add(f"{margin}[older chained exceptions left out]\n\n")
    for index, (current, joint) in enumerate(chain):
        if budget.exceptions >= EXCEPTIONS_KEPT:
            out.add(f"{margin}[more exceptions left out]\n")
            return
        budget.exceptions += 1
        _format_one(current, budget, out, margin, depth)
        if index + 1 < len(chain):
            out.add(_indented(joint, margin))


def _format_one(exc: BaseException, budget: Budget, out: _Text, margin: str, depth: int) -> None:
    head, between, tail, more = _frames(exc.__traceback__, budget)
    group = isinstance(exc, BaseExceptionGroup)
    if head:
        title = "Exception Group Traceback" if group else "Traceback"
        out.add(f"{margin}{title} (most recent call last):\n")
        for piece in tb_module.StackSummary.extract(iter(head)).format():
            out.add(_indented(piece, margin))
        if between or more:
            left_out = f"{between} frames" if between else "frames"
            goes_on = ", and it goes on (not walked)" if more else ""
            out.add(f"{margin}  [... {left_out} left out{goes_on} ...]\n")
        for piece in tb_module.StackSummary.extract(iter(tail)).format():
            out.add(_indented(piece, margin))
    out.add(_indented(_exception_line(exc), margin))
    notes = getattr(exc, "__notes__", None)
    if isinstance(notes, list | tuple):
        for note in notes[:NOTES_KEPT]:
            out.add(_indented(cut(describe(note), MAX_ERROR_MESSAGE) + "\n", margin))
        if len(notes) > NOTES_KEPT:
            out.add(f"{margin}[{len(notes) - NOTES_KEPT} more notes left out]\n")
    if isinstance(exc, BaseExceptionGroup):
        _format_members(exc, budget, out, margin, depth)


def _format_members(
    group: BaseExceptionGroup[BaseException], budget: Budget, out: _Text, margin: str, depth: int
) -> None:
    members = group.exceptions
    if depth + 1 >= GROUP_DEPTH:
        out.add(f"{margin}[{len(members)} exceptions of a group nested too deep left out]\n")
        return
    for number, member in enumerate(members[:GROUP_KEPT], 1):
        out.add(f"{margin}+---------------- {number} ----------------\n")
        _format(member, budget, out, margin + "| ", depth + 1)
    if len(members) > GROUP_KEPT:
        out.add(f"{margin}+---------------- and {len(members) - GROUP_KEPT} more exceptions\n")


def _exception_line(exc: BaseException) -> str:
    """``Type: message`` as the traceback module writes it, the message cut first."""
    name = type_name(type(exc))
    message = cut(describe(exc), MAX_ERROR_MESSAGE)
    return f"{name}: {message}\n" if message else f"{name}\n"


def _indented(text: str, margin: str) -> str:
    if not margin:
        return text
    return "".join(margin + line for line in text.splitlines(keepends=True))


Frame = tuple[FrameType, int]


def _frames(tb: TracebackType | None, budget: Budget) -> tuple[list[Frame], int, list[Frame], bool]:
    """The first ``FRAMES_KEPT`` and last ``FRAMES_KEPT`` frames of ``tb`` (as
    ``(frame, line)``), how many are between them, and whether the
    traceback goes on past the ``FRAMES_WALKED`` frames walked."""
    head: list[Frame] = []
    tail: deque[Frame] = deque(maxlen=FRAMES_KEPT)
    walked = 0
    while tb is not None and walked < FRAMES_WALKED:
        walked += 1
        entry = (tb.tb_frame, tb.tb_lineno)
        if len(head) < FRAMES_KEPT:
            head.append(entry)
        else:
            tail.append(entry)
        tb = tb.tb_next
    budget.frames += walked
    between = walked - len(head) - len(tail)
    return head, between, list(tail), tb is not None


def first_line(text: str) -> str:
    """The first line of ``text`` (a store's error adds DETAIL and HINT lines)."""
    line, _, rest = text.partition("\n")
    return line.rstrip() if rest else line
