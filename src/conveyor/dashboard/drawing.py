"""The drawing of a task's graph of dependencies (an SVG drawn here, as the
activity chart is, so the page needs no script to show it):
:func:`draw`.

The layers of the graph (:class:`~conveyor.graph.TaskGraph`: a task's
layer is its longest path from a root) are columns, left to right, each
task a box linked to its page, each edge a line from the box of the task
waited for to the box of the task waiting. A drawing stays small whatever
the graph: at most :data:`PER_LAYER` boxes a column and
:data:`MOST_DRAWN` in all, a column's rest drawn as one "+N more" box, and
at most :data:`MOST_LAYERS` columns (the rest counted under the drawing);
only the edges between boxes drawn are drawn.
"""

from __future__ import annotations

from dataclasses import dataclass

from conveyor.graph import TaskGraph

PER_LAYER = 24
"""The most tasks a column shows (then one "+N more" box)."""
MOST_DRAWN = 200
"""The most tasks a drawing shows in all."""
MOST_LAYERS = 40
"""The most columns a drawing shows."""
BOX_WIDTH, BOX_HEIGHT = 150, 36
COLUMN, ROW, MARGIN = 200, 48, 12
NAME_CHARS = 20
"""The characters of a task's name a box shows (its tooltip has the whole name)."""


@dataclass(frozen=True, slots=True)
class Box:
    """One box: a task (``task_id``), or the rest of a column (``more``)."""

    x: float
    y: float
    task_id: int | None
    label: str
    title: str
    state: str
    current: bool
    more: int = 0


@dataclass(frozen=True, slots=True)
class Line:
    x1: float
    y1: float
    x2: float
    y2: float
    settled: bool


@dataclass(frozen=True, slots=True)
class Drawing:
    """A graph's drawing, laid out by ``task_graph.html``."""

    width: int
    height: int
    box_width: int
    box_height: int
    boxes: list[Box]
    lines: list[Line]
    hidden_tasks: int
    hidden_layers: int


def draw(graph: TaskGraph) -> Drawing:
    """The boxes and lines of ``graph``'s drawing (see the module docstring)."""
    boxes: list[Box] = []
    where: dict[int, Box] = {}
    budget, hidden, tallest = MOST_DRAWN, 0, 1
    layers = graph.layers
    for column, layer in enumerate(layers[:MOST_LAYERS]):
        shown = layer[: min(PER_LAYER, budget)]
        budget -= len(shown)
        x = MARGIN + column * COLUMN
        for row, node in enumerate(shown):
            state = node.state.value if node.state is not None else "deleted"
            name = node.name if node.name is not None else "(deleted)"
            label = name if len(name) <= NAME_CHARS else name[: NAME_CHARS - 1] + "…"
            box = Box(
                x,
                MARGIN + row * ROW,
                node.id,
                label,
                f"task {node.id} {name}: {state.replace('_', ' ')}",
                state,
                node.id == graph.task_id,
            )
            boxes.append(box)
            where[node.id] = box
        rest = len(layer) - len(shown)
        if rest:
            hidden += rest
            more = f"+{rest:,} more"
            boxes.append(Box(x, MARGIN + len(shown) * ROW, None, more, more, "more", False, rest))
        tallest = max(tallest, len(shown) + (1 if rest else 0))
    hidden_layers = max(len(layers) - MOST_LAYERS, 0)
    hidden += sum(len(layer) for layer in layers[MOST_LAYERS:])
    lines = [
        Line(
            where[e.dependency].x + BOX_WIDTH,
            where[e.dependency].y + BOX_HEIGHT / 2,
            where[e.dependent].x,
            where[e.dependent].y + BOX_HEIGHT / 2,
            e.settled,
        )
        for e in graph.edges
        if e.dependency in where and e.dependent in where
    ]
    columns = min(len(layers), MOST_LAYERS)
    return Drawing(
        width=2 * MARGIN + (columns - 1) * COLUMN + BOX_WIDTH,
        height=2 * MARGIN + (tallest - 1) * ROW + BOX_HEIGHT,
        box_width=BOX_WIDTH,
        box_height=BOX_HEIGHT,
        boxes=boxes,
        lines=lines,
        hidden_tasks=hidden,
        hidden_layers=hidden_layers,
    )
