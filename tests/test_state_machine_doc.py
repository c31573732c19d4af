"""docs/state_machine.md and conveyor.model.STATE_CHANGES say the same: the
table of moves row for row, and the diagram edge for edge."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

from conveyor.model import STATE_CHANGES

DOC = Path(__file__).resolve().parent.parent / "docs" / "state_machine.md"
HEADER = "| from | cause | to | notes |"
EDGE = re.compile(r"^\s*(\[\*\]|\w+) --> (\w+): (.+)$")


def doc_rows() -> list[tuple[str, str, str, str]]:
    """The rows of the document's table of moves, as text."""
    lines = DOC.read_text(encoding="utf-8").splitlines()
    start = lines.index(HEADER) + 2  # past the header and its rule
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        assert len(cells) == 4, f"a row of four cells, not {line!r}"
        rows.append((cells[0], cells[1], cells[2], cells[3]))
    return rows


def table_rows() -> list[tuple[str, str, str, str]]:
    return [
        (c.from_state.value if c.from_state else "(new)", c.cause.value, c.to_state.value, c.notes)
        for c in STATE_CHANGES
    ]


def test_the_document_lists_every_move_of_the_code_in_its_order() -> None:
    assert doc_rows() == table_rows()


def test_the_diagram_draws_every_move() -> None:
    text = DOC.read_text(encoding="utf-8")
    diagram = text.split("```mermaid", 1)[1].split("```", 1)[0]
    drawn: dict[tuple[str, str], set[str]] = {}
    for line in diagram.splitlines():
        match = EDGE.match(line)
        if match:
            source = "(new)" if match.group(1) == "[*]" else match.group(1)
            key = (source, match.group(2))
            assert key not in drawn, f"edge {key} drawn twice"
            drawn[key] = {cause.strip() for cause in match.group(3).split(",")}
    expected: dict[tuple[str, str], set[str]] = defaultdict(set)
    for source, cause, target, _notes in table_rows():
        expected[(source, target)].add(cause)
    assert drawn == dict(expected)
