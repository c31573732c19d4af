"""Text from a store, shown as text: the one way the commands print it.

Whoever can enqueue a task, or make one fail, writes text that the commands
print: task names and queues, payloads and results, error messages and
tracebacks, worker ids and hosts, pause, schedule and key names, messages.
Printed as it is, that text could hold rich markup (``[/x]`` ends a command
with a MarkupError, ``[link=...]`` becomes a hyperlink), emoji codes
(``:smile:``), or control sequences a terminal obeys (ESC clears the screen,
an OSC sets the window title or the clipboard).

:func:`shown` escapes the characters a terminal could act on, and
:func:`plain` returns a :class:`rich.text.Text` of it, which rich prints as
it is: no markup, no emoji code, no highlighting. Guarantees: the result
holds no C0 control character (``\\x00``-``\\x1f``; with ``block``, ``\\n``
and ``\\t`` are kept, for a traceback printed as a block), no DEL, no C1
control character (``\\x80``-``\\x9f``), no Unicode bidirectional control
(U+061C, U+200E, U+200F, U+202A-U+202E, U+2066-U+2069) and no line or
paragraph separator (U+2028, U+2029): each is shown as its escape, ``\\x1b``,
``\\n``, ``\\u202e``. Limits: a backslash is kept as it is, so stored text
that spells ``\\x1b`` looks like an escaped ESC; other characters, wide or
combining ones among them, are printed as they are.
"""

from __future__ import annotations

import re

from rich.text import Text

_LINE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")
_BLOCK = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")
_SHORT = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _escape(found: re.Match[str]) -> str:
    char = found.group()
    if char in _SHORT:
        return _SHORT[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def shown(value: object, *, block: bool = False) -> str:
    """``value`` (``str()`` of it, None as the empty string) with every
    character a terminal could act on escaped (see the module); ``block``
    keeps newlines and tabs, for text printed as lines of its own."""
    text = "" if value is None else str(value)
    return (_BLOCK if block else _LINE).sub(_escape, text)


def plain(value: object, *, block: bool = False, style: str = "") -> Text:
    """``value`` as :func:`shown` escapes it, in a rich Text (in ``style``,
    one of ours): a table cell or a line rich prints as it is."""
    return Text(shown(value, block=block), style=style, end="\n")


def line(*parts: object) -> Text:
    """One line of rich Text from its parts: a Text (:func:`plain`, or our
    own words in a style of ours: ``plain("task 7", style="bold")``) is kept
    as it is, anything else (stored text among it) is escaped as
    :func:`shown` escapes it. No part is read as markup."""
    return Text.assemble(*(part if isinstance(part, Text) else shown(part) for part in parts))
