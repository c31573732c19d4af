"""The commands of flow control and retention: ``pause``, ``resume``,
``pauses``, ``keys``, ``schedules`` and ``prune``."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import click
from rich.table import Table

from conveyor.app import App
from conveyor.cli.common import (
    backend_options,
    console,
    fail,
    json_option,
    parse_duration,
    with_client,
)
from conveyor.cli.shapes import pause_json, schedule_json
from conveyor.cli.text import plain, shown
from conveyor.durations import relative, span
from conveyor.errors import ConveyorError
from conveyor.model import Task
from conveyor.records import StoredSchedule
from conveyor.retention import Retention
from conveyor.schedules import next_stored_slot


def _target(fn: click.decorators.FC) -> click.decorators.FC:
    fn = click.option("--task", "task_name", help="A task name, in every queue.")(fn)
    fn = click.option("--queue", help="A queue, for every task name.")(fn)
    return fn


def _switch(
    action: str, queue: str | None, task_name: str | None, url: str | None, schema: str | None
) -> None:
    if (queue is None) == (task_name is None):
        fail(f"give one --queue or one --task to {action}")
    changed = with_client(
        url,
        schema,
        lambda app: (app.pause if action == "pause" else app.resume)(queue=queue, task=task_name),
    )
    what = shown(f"queue {queue}" if queue is not None else f"task {task_name}")
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
    found = with_client(url, schema, lambda app: app.pauses())
    if as_json:
        click.echo(json.dumps([pause_json(p) for p in found]))
        return
    if not found:
        console.print("nothing is paused")
        return
    now = datetime.now(UTC)
    table = Table("kind", "name", "paused")
    for p in found:
        table.add_row(p.kind.value, plain(p.name), relative(p.paused_at, now))
    console.print(table)


def _age(text: str, option: str) -> float | None:
    if text.strip().lower() in ("never", "forever"):
        return None
    seconds = parse_duration(text)
    if seconds is None or seconds < 1:
        fail(f"{option} takes an age such as 90s, 15m, 2h, 7d, or 'forever': {text!r}")
    return seconds


@click.command()
@click.option(
    "--succeeded", default="1d", show_default=True, help="Keep succeeded tasks this long."
)
@click.option("--failed", default="14d", show_default=True, help="Keep failed tasks this long.")
@click.option(
    "--cancelled", default="14d", show_default=True, help="Keep cancelled tasks this long."
)
@click.option(
    "--workers", default="1d", show_default=True, help="Keep stopped or silent workers this long."
)
@click.option("--dry-run", is_flag=True, help="Only count what would go.")
@backend_options
@json_option
def prune(
    succeeded: str,
    failed: str,
    cancelled: str,
    workers: str,
    dry_run: bool,
    url: str | None,
    schema: str | None,
    as_json: bool,
) -> None:
    """Delete finished tasks (with their attempts and messages) and stopped
    workers older than their age ('forever' keeps them), as workers do on
    their own every minute. Never an unfinished task, nor a finished one
    whose parent is still alive."""
    try:
        retention = Retention(
            succeeded=_age(succeeded, "--succeeded"),
            failed=_age(failed, "--failed"),
            cancelled=_age(cancelled, "--cancelled"),
            workers=_age(workers, "--workers"),
        )
    except ConveyorError as exc:  # an age past the longest duration
        fail(exc)
    done = with_client(url, schema, lambda app: app.prune(retention, dry_run=dry_run))
    if as_json:
        click.echo(json.dumps({"tasks": done.tasks, "workers": done.workers, "dry_run": dry_run}))
    elif dry_run:
        click.echo(f"would prune {done.tasks} task(s) and {done.workers} worker(s)")
    else:
        click.echo(f"pruned {done.tasks} task(s) and {done.workers} worker(s)")


@click.command()
@backend_options
@json_option
def schedules(url: str | None, schema: str | None, as_json: bool) -> None:
    """List the schedules workers synced: each with its next slot, its last
    slot fired and the task that slot enqueued."""

    def read(app: App) -> tuple[datetime, list[StoredSchedule], dict[str, Task | None]]:
        now, rows = app.stored_schedules()
        return now, rows, {row.name: app.get(row.last_task_id) for row in rows if row.last_task_id}

    now, rows, last = with_client(url, schema, read)
    if as_json:
        click.echo(
            json.dumps([schedule_json(r, next_stored_slot(r, now), last.get(r.name)) for r in rows])
        )
        return
    if not rows:
        console.print("no schedules: a worker syncs its app's schedules when it starts")
        return
    table = Table("name", "task", "when", "next", "last slot", "last task")
    for row in rows:
        upcoming = next_stored_slot(row, now)
        task = last.get(row.name)
        table.add_row(
            plain(row.name),
            plain(row.task),
            plain(f"every {row.every:g}s" if row.every is not None else f"{row.cron} ({row.tz})"),
            f"{upcoming:%Y-%m-%d %H:%M:%S}Z (in {span((upcoming - now).total_seconds())})"
            if upcoming
            else "?",
            relative(row.last_slot, now) if row.last_slot else "",
            f"{row.last_task_id} {task.state.value}" if task else str(row.last_task_id or ""),
        )
    console.print(table)


@click.command()
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True)
@backend_options
@json_option
def keys(limit: int, url: str | None, schema: str | None, as_json: bool) -> None:
    """List the flow-control keys (concurrency keys, rate limits) holding
    tasks: running and pending tasks per key, and for a rate its tokens and
    when the next start comes."""
    found = with_client(url, schema, lambda app: app.list_keys(limit))
    if as_json:
        click.echo(json.dumps([k.as_json() for k in found]))
        return
    if not found:
        console.print("no flow-control key holds a task")
        return
    now = datetime.now(UTC)
    table = Table("key", "running", "pending", "rate", "tokens", "next start")
    for k in found:
        rate = f"{k.rate_limit} per {k.rate_period:g}s" if k.rate_limit else ""
        limit_text = "" if k.max_running >= 1_000_000 else f" of {k.max_running}"
        table.add_row(
            plain(k.key),
            f"{k.running}{limit_text}",
            str(k.pending),
            rate,
            f"{k.tokens:.2f}" if k.tokens is not None else "",
            f"in {span((k.next_start_at - now).total_seconds())}" if k.next_start_at else "",
        )
    console.print(table)
