"""The one function the commands print stored text through: what it escapes
and what it keeps."""

from __future__ import annotations

from conveyor.cli.text import line, plain, shown
from tests.test_cli_stored_text import CONTROLS, MARKUP


def test_shown_escapes_what_a_terminal_acts_on() -> None:
    assert shown(CONTROLS) == (
        "\\x1b[2J \\x1b]0;title\\x07 \\x1b]52;c;ZXZpbA==\\x07 \\x9b31m \\x07 \\x7f "
        "\\u202e \\u2066 \\x01 \\r"
    )
    assert shown("a\nb\tc") == "a\\nb\\tc"
    assert shown("a\nb\tc\x1b", block=True) == "a\nb\tc\\x1b"
    assert shown(None) == ""
    assert shown("naïve 東京 \\x1b") == "naïve 東京 \\x1b"  # printable text, as it is
    assert plain(MARKUP).plain == MARKUP
    assert plain(MARKUP).spans == []
    assert line(plain("ours", style="bold"), " ", CONTROLS).plain.startswith("ours \\x1b[2J")


def test_rich_prints_it_as_it_is() -> None:
    from rich.console import Console

    console = Console(force_terminal=True, color_system="truecolor", record=True, width=200)
    console.print(plain(f"{MARKUP} {CONTROLS}"))
    out = console.export_text()
    assert MARKUP in out
    assert "\\x1b]52;c;ZXZpbA==\\x07" in out
