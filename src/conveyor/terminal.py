"""Text for a terminal: :func:`shown` escapes the characters a terminal
could act on, in text that came from outside (a store, a handler's error).

It holds no C0 control character (``\\x00``-``\\x1f``; with ``block``,
``\\n`` and ``\\t`` are kept, for a traceback printed as a block), no DEL,
no C1 control character (``\\x80``-``\\x9f``), no Unicode bidirectional
control (U+061C, U+200E, U+200F, U+202A-U+202E, U+2066-U+2069) and no line
or paragraph separator (U+2028, U+2029): each is shown as its escape,
``\\x1b``, ``\\n``, ``\\u202e``. So no ESC or OSC sequence (clear the
screen, set the window title or the clipboard) and no bidi reordering
reaches the terminal. Limits: a backslash is kept as it is, so text that
spells ``\\x1b`` looks like an escaped ESC; other characters, wide or
combining ones among them, are printed as they are; it knows nothing of
rich markup (:mod:`conveyor.cli.text` prints through it as rich Text).
No I/O.
"""

from __future__ import annotations

import re

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
