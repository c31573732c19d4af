"""Error texts cut to size before anything else touches them.

A handler may raise an exception whose message is tens of megabytes, full
of NUL characters or lone surrogates. Everything here is bounded by the
limit, not by the input: the text is cut first and only the cut part is
cleaned, so an enormous error costs the worker no more than a small one.
"""

from __future__ import annotations

import traceback as tb_module

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


def format_traceback(exc: BaseException, limit: int) -> str:
    """The traceback of ``exc`` (with its causes), at most ``limit`` characters.

    Each piece is cut to what is left of the limit before it is kept, and
    formatting stops once the limit is reached, so a huge message in the
    chain costs one copy at most."""
    pieces: list[str] = []
    size = total = 0
    try:
        formatted = tb_module.TracebackException.from_exception(exc)
        _cut_messages(formatted, limit)
        for piece in formatted.format():
            left = limit + 1 - size
            pieces.append(piece[:left])
            size += min(len(piece), left)
            total += len(piece)
            if size > limit:
                break
    except BaseException:
        return f"{type(exc).__name__}: (traceback unavailable)"
    text = "".join(pieces)
    if size <= limit:
        return cut(text, limit)
    kept = storable(text[: limit - CUT_NOTE])[: limit - CUT_NOTE]
    return kept + f"... [at least {total - len(kept)} characters cut]"


def _cut_messages(formatted: tb_module.TracebackException, limit: int) -> None:
    """Cut the message of every exception in the chain before it is formatted
    (formatting copies it whole). The message is a private attribute of
    ``TracebackException`` (``_str``, Python 3.11 to 3.13); where it is
    missing nothing is cut here, and ``format_traceback`` still bounds what
    it keeps."""
    seen: set[int] = set()
    pending = [formatted]
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        message = getattr(current, "_str", None)
        if isinstance(message, str) and len(message) > limit:
            setattr(current, "_str", message[:limit])  # noqa: B010 - private, see above
        pending += [
            linked
            for linked in (current.__cause__, current.__context__, *(current.exceptions or ()))
            if linked is not None
        ]


def first_line(text: str) -> str:
    """The first line of ``text`` (a store's error adds DETAIL and HINT lines)."""
    line, _, rest = text.partition("\n")
    return line.rstrip() if rest else line
