"""The command that reads (and may act on) the graph of dependencies
around a task: ``graph``."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import click

from conveyor.cli.common import (
    TASK_ID,
    backend_options,
    console,
    fail,
    json_option,
    open_client,
    warn,
)
from conveyor.cli.control import ACTIONS, PAGE
from conveyor.cli.text import line, plain
from conveyor.controls import CANCELLABLE
from conveyor.errors import ConveyorError
from conveyor.graph import DEFAULT_LIMIT, TaskGraph
from conveyor.model import TaskState


def graph_json(graph: TaskGraph, limit: int) -> dict[str, Any]:
    """The graph as ``graph --json`` prints it."""
    return {
        "task_id": graph.task_id,
        "counts": graph.counts,
        "roots": graph.roots,
        "nodes": [
            {
                "id": n.id,
                "name": n.name,
                "state": None if n.state is None else n.state.value,
                "layer": n.layer,
            }
            for n in graph.nodes
        ],
        "edges": [
            {
                "dependent": e.dependent,
                "position": e.position,
                "dependency": e.dependency,
                "settled": e.settled,
            }
            for e in graph.edges
        ],
        "truncated": graph.truncated,
        "limit": limit,
    }


def _in_chunks(act: Callable[..., list[int]], ids: list[int], **selection: Any) -> list[int]:
    """A bulk action among ``ids``, :data:`PAGE` ids a call (each call
    batched in the store as the bulk commands' are)."""
    done: list[int] = []
    for start in range(0, len(ids), PAGE):
        done += act(ids=ids[start : start + PAGE], batch=PAGE, **selection)
    return done


def _print(graph: TaskGraph, limit: int) -> None:
    counts = ", ".join(f"{state} {count}" for state, count in graph.counts.items())
    console.print(
        line(
            plain(f"task {graph.task_id}", style="bold"),
            f": {len(graph.nodes)} task(s) in its graph, {len(graph.edges)} edge(s)",
        )
    )
    console.print(f"states: {counts}")
    for number, layer in enumerate(graph.layers):
        console.print(f"layer {number}:")
        for node in layer:
            state = node.state.value if node.state is not None else "deleted"
            console.print(line(f"  {node.id} {state} ", node.name or "?"))
    if graph.truncated:
        console.print(f"truncated at {limit} task(s): --limit reads more")


@click.command()
@click.argument("task_id", type=TASK_ID)
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=DEFAULT_LIMIT,
    show_default=True,
    help="Read at most this many tasks of the graph.",
)
@click.option("--cancel", is_flag=True, help="Cancel every task of the graph not ended.")
@click.option("--retry-failed", is_flag=True, help="Retry every failed task of the graph.")
@backend_options
@json_option
def graph(
    task_id: int,
    limit: int,
    cancel: bool,
    retry_failed: bool,
    url: str | None,
    schema: str | None,
    as_json: bool,
) -> None:
    """Show the graph of dependencies around task TASK_ID: its tasks by layer
    (a root waits for none; a task's layer is its longest path from one),
    counted by state; a chord's members and callback, a chain's links.

    --cancel cancels its pending, waiting and running tasks, --retry-failed
    runs its failed ones again, each as the bulk `cancel` and `retry` do (in
    batches that read each task's state in the same write), and only among
    the tasks read (see --limit). A group without a callback has no edge:
    each of its members is a graph of its own."""
    if cancel and retry_failed:
        fail("give --cancel or --retry-failed, not both")
    done: list[int] = []
    try:
        with open_client(url, schema) as app:
            found = app.graph(task_id, limit)
            if cancel:
                done = _in_chunks(app.cancel_many, found.ids(*CANCELLABLE), states=CANCELLABLE)
            elif retry_failed:
                done = _in_chunks(
                    app.retry_many, found.ids(TaskState.FAILED), states=(TaskState.FAILED,)
                )
    except ConveyorError as exc:
        fail(exc)
    action = "cancel" if cancel else "retry" if retry_failed else None
    if as_json:
        data = graph_json(found, limit)
        if action is not None:
            data[ACTIONS[action][0]] = done
        click.echo(json.dumps(data))
    else:
        _print(found, limit)
        if action is not None:
            click.echo(f"{ACTIONS[action][0]} {len(done)} task(s)")
    if action is not None and found.truncated:
        warn(
            f"only the {len(found.nodes)} task(s) read were {ACTIONS[action][0]}: "
            "--limit reads more"
        )
