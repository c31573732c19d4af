"""The commands of flow control: ``pause``, ``resume`` and ``pauses``."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import click
from rich.table import Table

from conveyor.cli.common import (
    backend_options,
    console,
    fail,
    json_option,
    open_client,
    relative,
)
from conveyor.errors import ConveyorError


def _target(fn: click.decorators.FC) -> click.decorators.FC:
    fn = click.option("--task", "task_name", help="A task name, in every queue.")(fn)
    fn = click.option("--queue", help="A queue, for every task name.")(fn)
    return fn


def _switch(
    action: str, queue: str | None, task_name: str | None, url: str | None, schema: str | None
) -> None:
    if (queue is None) == (task_name is None):
        fail(f"give one --queue or one --task to {action}")
    try:
        with open_client(url, schema) as app:
            move = app.pause if action == "pause" else app.resume
            changed = move(queue=queue, task=task_name)
    except ConveyorError as exc:
        fail(exc)
    what = f"queue {queue}" if queue is not None else f"task {task_name}"
    if action == "pause":
        click.echo(f"{what}: paused" if changed else f"{what}: was paused already")
    else:
        click.echo(f"{what}: resumed" if changed else f"{what}: was not paused")


@click.command()
@_target
@backend_options
def pause(queue: str | None, task_name: str | None, url: str | None, schema: str | None) -> None:
    """Pause a queue or a task name: within about a second no worker starts
    an attempt of its tasks (running ones go on). Lasts until `resume`."""
    _switch("pause", queue, task_name, url, schema)


@click.command()
@_target
@backend_options
def resume(queue: str | None, task_name: str | None, url: str | None, schema: str | None) -> None:
    """Resume a paused queue or task name; idle workers start at once."""
    _switch("resume", queue, task_name, url, schema)


@click.command()
@backend_options
@json_option
def pauses(url: str | None, schema: str | None, as_json: bool) -> None:
    """List the paused queues and task names."""
    try:
        with open_client(url, schema) as app:
            found = app.pauses()
    except ConveyorError as exc:
        fail(exc)
    if as_json:
        click.echo(
            json.dumps(
                [
                    {"kind": p.kind.value, "name": p.name, "paused_at": p.paused_at.isoformat()}
                    for p in found
                ]
            )
        )
        return
    if not found:
        console.print("nothing is paused")
        return
    now = datetime.now(UTC)
    table = Table("kind", "name", "paused")
    for p in found:
        table.add_row(p.kind.value, p.name, relative(p.paused_at, now))
    console.print(table)
