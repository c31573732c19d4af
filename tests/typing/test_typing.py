"""Task definitions and handles are typed from their handlers: mypy, run on
the files next to this one, accepts what is right and flags what is wrong."""

from __future__ import annotations

import re
from pathlib import Path

from mypy import api

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def _mypy(*files: Path) -> list[tuple[str, int, str]]:
    """(file name, line, error code) of each error mypy reports."""
    stdout, stderr, _ = api.run(
        [
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--show-error-codes",
            "--no-error-summary",
            "--no-pretty",
            *(str(file) for file in files),
        ]
    )
    assert not stderr, stderr
    found = []
    for line in stdout.splitlines():
        match = re.match(r"(.+?):(\d+): error: .*\[([a-z-]+)\]$", line)
        if match:
            found.append((Path(match[1]).name, int(match[2]), match[3]))
        else:
            assert ": note: " in line, line
    return found


def _expected(file: Path) -> list[tuple[str, int, str]]:
    lines = file.read_text().splitlines()
    return [
        (file.name, number, match[1])
        for number, line in enumerate(lines, start=1)
        if (match := re.search(r"# error: ([a-z-]+)$", line))
    ]


def test_handles_are_typed_by_their_handler_and_wrong_uses_are_flagged() -> None:
    right, wrong = HERE / "check_handles.py", HERE / "wrong_uses.py"
    expected = _expected(wrong)
    assert len(expected) == 5
    assert sorted(_mypy(right, wrong)) == sorted(expected)
