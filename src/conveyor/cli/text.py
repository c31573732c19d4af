"""Text from a store, shown as text: the one way the commands print it.

Whoever can enqueue a task, or make one fail, writes text that the commands
print: task names and queues, payloads and results, error messages and
tracebacks, worker ids and hosts, pause, schedule and key names, messages.
Printed as it is, that text could hold rich markup (``[/x]`` ends a command
with a MarkupError, ``[link=...]`` becomes a hyperlink), emoji codes
(``:smile:``), or control sequences a terminal obeys (ESC clears the screen,
an OSC sets the window title or the clipboard).

:func:`plain` returns a :class:`rich.text.Text` of it, escaped by
:func:`conveyor.terminal.shown` (no control character, no bidi control: see
there), which rich prints as it is: no markup, no emoji code, no
highlighting. :func:`line` assembles a line of our words and such values.
"""

from __future__ import annotations

from rich.text import Text

from conveyor.terminal import shown

__all__ = ["line", "plain", "shown"]


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
