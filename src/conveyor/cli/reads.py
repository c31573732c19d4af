"""The commands that read: ``tasks``, ``counts``, ``show``, ``workers``, ``health``."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import click
from rich.table import Table

from conveyor.app import App
from conveyor.cli.common import (
    EXIT_ERROR,
    TASK_ID,
    backend_options,
    console,
    fail,
    iso,
    json_option,
    open_client,
    serving,
    state_choice,
    unserved,
    warn,
    with_client,
)
from conveyor.cli.shapes import (
    WAITS,
    dependency_json,
    due_at,
    message_json,
    task_json,
    worker_json,
)
from conveyor.cli.text import line, plain
from conveyor.durations import relative
from conveyor.errors import ConveyorError
from conveyor.model import Task, TaskState
from conveyor.records import DependencyRecord, TaskSummary, WorkerInfo


def _due(task: TaskSummary, now: datetime) -> str:
    moment = due_at(task)
    return relative(moment, now) if moment is not None else ""


def _warn_unserved(
    found: Sequence[Task | TaskSummary], workers: list[WorkerInfo], now: datetime
) -> None:
    pairs = [(t.name, t.queue) for t in found if t.state is TaskState.PENDING]
    for name, queue in unserved(pairs, workers, now):
        warn(f"no live worker serves task {name!r} on queue {queue!r}: it stays pending")


@click.command()
@click.option("--state", type=state_choice, help="Only tasks in this state.")
@click.option("--name", help="Only tasks of this name.")
@click.option("--queue", help="Only tasks of this queue.")
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True)
@click.option("--before", type=TASK_ID, help="Only tasks with a smaller id: the next page.")
@backend_options
@json_option
def tasks(
    state: str | None,
    name: str | None,
    queue: str | None,
    limit: int,
    before: int | None,
    url: str | None,
    schema: str | None,
    as_json: bool,
) -> None:
    """List tasks, newest first; page on with --before (the last id shown).

    The table reads summaries (no payload or result); ``--json`` prints each
    task whole, payload and result included. A pending task that no live
    worker serves (its name or queue) is named in a warning on stderr."""
    whole: list[Task] = []
    summaries: list[TaskSummary] = []
    try:
        with open_client(url, schema) as app:
            if as_json:
                whole = app.list_tasks(
                    state=state, name=name, queue=queue, limit=limit, before=before
                )
            else:
                summaries = app.list_summaries(
                    state=state, name=name, queue=queue, limit=limit, before=before
                )
            workers = app.list_workers()
    except ConveyorError as exc:
        fail(exc)
    now = datetime.now(UTC)
    found: Sequence[Task | TaskSummary] = whole if as_json else summaries
    if as_json:
        click.echo(json.dumps([task_json(t, with_attempts=False) for t in whole]))
    else:
        table = Table("id", "name", "queue", "state", "priority", "attempt", "due", "created")
        for t in summaries:
            table.add_row(
                str(t.id),
                plain(t.name),
                plain(t.queue),
                t.state.value,
                str(t.priority),
                f"{t.attempt}/{t.max_attempts}",
                _due(t, now),
                relative(t.created_at, now),
            )
        console.print(table)
        if len(found) == limit:
            console.print(f"more with --before {found[-1].id}")
    _warn_unserved(found, workers, now)


@click.command()
@backend_options
@json_option
def counts(url: str | None, schema: str | None, as_json: bool) -> None:
    """Count tasks by state, queue and name."""
    found = with_client(url, schema, lambda app: app.count_tasks())
    if as_json:
        rows = [
            {"state": c.state.value, "queue": c.queue, "name": c.name, "count": c.count}
            for c in found
        ]
        click.echo(json.dumps(rows))
        return
    table = Table("state", "queue", "name", "count")
    for c in found:
        table.add_row(c.state.value, plain(c.queue), plain(c.name), str(c.count))
    console.print(table)


@click.command()
@click.argument("task_id", type=TASK_ID)
@backend_options
@json_option
def show(task_id: int, url: str | None, schema: str | None, as_json: bool) -> None:
    """Show a task: when it is due, who runs it, and its attempt history."""
    try:
        with open_client(url, schema) as app:
            task = app.get(task_id)
            inbox = app.inbox(task_id) if task is not None and task.inbox else []
            workers = app.list_workers() if task is not None else []
            waited = task is not None and task.waiting_for is not None
            dependencies = app.dependencies(task_id) if waited else []
    except ConveyorError as exc:
        fail(exc)
    if task is None:
        fail(f"no task with id {task_id}")
    now = datetime.now(UTC)
    if as_json:
        data = task_json(task, with_attempts=True)
        if task.inbox:
            data["messages"] = [message_json(m) for m in inbox]
        if task.waiting_for is not None:
            data["dependencies"] = [dependency_json(d) for d in dependencies]
        click.echo(json.dumps(data))
        _warn_unserved([task], workers, now)
        return
    console.print(
        line(
            plain(f"task {task.id}", style="bold"),
            " ",
            task.name,
            " on ",
            task.queue,
            ": ",
            plain(task.state.value, style="bold"),
            f" (priority {task.priority}, attempt {task.attempt}/{task.max_attempts})",
        )
    )
    _print_when(task, workers, now)
    if task.step is not None:
        console.print(line("step: ", task.step))
    if task.parent_id is not None:
        console.print(f"parent: {task.parent_id}")
    if task.waiting_for is not None:
        _print_dependencies(task.waiting_for, dependencies)
    _print_progress(task, now)
    stateful = task.step is not None or task.inbox
    console.print(line("state: " if stateful else "payload: ", json.dumps(task.payload)))
    if task.inbox:
        console.print(f"inbox: {len(inbox)} unread message(s)")
        for m in inbox:
            sender = f"task {m.sender_id}" if m.sender_id is not None else "outside"
            console.print(line(f"  {m.id} {m.kind.value} from {sender}: ", json.dumps(m.body)))
    if task.result is not None:
        console.print(line("result: ", json.dumps(task.result)))
    _print_attempts(task)


def _print_progress(task: Task, now: datetime) -> None:
    """The task's latest progress report, if any: its note is stored text, printed as text."""
    if task.progress is not None:
        reported = f" (attempt {task.progress.attempt}, {relative(task.progress.at, now)})"
        console.print(line("progress: ", task.progress.summary(), reported))


def _print_dependencies(waiting_for: int, dependencies: list[DependencyRecord]) -> None:
    left = f"{waiting_for} not ended" if waiting_for else "all ended"
    console.print(f"dependencies: {len(dependencies)}, {left}")
    for d in dependencies:
        state = d.state.value if d.state is not None else "deleted"
        console.print(line(f"  {d.task_id} ", d.name or "?", f": {state}"))


@click.command()
@click.argument("task_id", type=TASK_ID)
@backend_options
@json_option
def explain(task_id: int, url: str | None, schema: str | None, as_json: bool) -> None:
    """Why a task is not running, or what it is doing: one sentence and the
    facts behind it (its pause, its workers, its concurrency key...)."""
    try:
        with open_client(url, schema) as app:
            found = app.explain(task_id)
    except ConveyorError as exc:
        fail(exc)
    if as_json:
        data = {"task_id": found.task_id, "reason": found.reason, "sentence": found.sentence}
        click.echo(json.dumps({**data, "facts": found.facts}))
        return
    console.print(line(plain(found.reason, style="bold"), ": ", found.sentence))
    for name, value in found.facts.items():
        console.print(line(f"  {name}: ", json.dumps(value)))


def _print_when(task: Task, workers: list[WorkerInfo], now: datetime) -> None:
    """When a pending or waiting task is due, or whose lease a running one holds."""
    moment = due_at(task)
    if moment is not None:
        what = "due" if task.state is TaskState.PENDING else "wakes without a message"
        console.print(f"{what}: {relative(moment, now)} ({iso(moment)})")
    if task.state is TaskState.IN_PROGRESS and task.lease_expires_at is not None:
        console.print(
            line(
                "running on ",
                task.worker_id,
                f"; lease ends {relative(task.lease_expires_at, now)}",
            )
        )
    if task.state in WAITS and unserved([(task.name, task.queue)], workers, now):
        console.print(
            line(
                plain(f"no live worker serves {task.name!r} on queue {task.queue!r}", style="bold"),
                " (",
                serving(workers, now),
                ")",
            )
        )


def _print_attempts(task: Task) -> None:
    steps = any(a.step is not None for a in task.attempts)
    table = Table(
        "#", *(["step"] if steps else []), "worker", "outcome", "started", "finished", "error"
    )
    for a in task.attempts:
        error = f"{a.error_type}: {a.error_message}" if a.error_type else ""
        table.add_row(
            str(a.number),
            *([plain(a.step)] if steps else []),
            plain(a.worker_id),
            a.outcome.value,
            iso(a.started_at) or "",
            iso(a.finished_at) or "",
            plain(error),
        )
    console.print(table)
    last = task.last_attempt
    if last is not None and last.traceback:
        console.print(plain(last.traceback, block=True))


@click.command()
@click.option("--all", "show_all", is_flag=True, help="Also stopped and silent workers.")
@backend_options
@json_option
def workers(url: str | None, schema: str | None, as_json: bool, show_all: bool) -> None:
    """List live workers (heard from within three heartbeats) with what they serve."""
    found = with_client(url, schema, lambda app: app.list_workers())
    now = datetime.now(UTC)
    shown = found if show_all else [w for w in found if w.live(now)]
    if as_json:
        click.echo(json.dumps([worker_json(w, now) for w in shown]))
        return
    table = Table("id", "host", "pid", "queues", "tasks", "slots", "last seen", "stopped")
    for w in shown:
        table.add_row(
            plain(w.id),
            plain(w.host),
            str(w.pid),
            plain(",".join(w.queues)),
            plain(", ".join(w.tasks)),
            str(w.concurrency),
            relative(w.last_seen_at, now) if w.last_seen_at else "",
            relative(w.stopped_at, now) if w.stopped_at else "",
        )
    console.print(table)
    if not show_all and len(shown) < len(found):
        console.print(f"{len(found) - len(shown)} stopped or silent worker(s): --all shows them")


@click.command()
@click.option(
    "--min-workers",
    type=click.IntRange(min=0),
    default=1,
    show_default=True,
    help="Live workers needed to be healthy (0: check the store only).",
)
@backend_options
@json_option
def health(url: str | None, schema: str | None, min_workers: int, as_json: bool) -> None:
    """Check the store is reachable, its schema current and enough workers live.

    Exit code 0: healthy; 1: the schema is behind or too few workers are
    live; 2: the store cannot be reached. Reads only: applies no migration."""
    try:
        report = asyncio.run(_health(open_client(url, schema), min_workers))
    except ConveyorError as exc:
        fail(exc)
    if as_json:
        click.echo(json.dumps(report))
    else:
        console.print(line("store: ", report["store"], ": reachable"))
        pending = report["pending_migrations"]
        console.print(
            "schema: current"
            if not pending
            else f"schema: {len(pending)} migration(s) pending: run `conveyor migrate`"
        )
        console.print(f"workers: {len(report['workers'])} live (at least {min_workers} needed)")
        for w in report["workers"]:
            console.print(
                line("  ", w["id"], " on ", w["host"], ": queues ", ",".join(w["queues"]))
            )
    if not report["healthy"]:
        raise SystemExit(EXIT_ERROR)


async def _health(app: App, min_workers: int) -> dict[str, Any]:
    status = await app.store_status_async()
    pending, found = [m.name for m in status.pending], status.workers
    now = datetime.now(UTC)
    live = [worker_json(w, now) for w in found if w.live(now)]
    return {
        "store": app.location,
        "pending_migrations": pending,
        "workers": live,
        "healthy": not pending and len(live) >= min_workers,
    }
