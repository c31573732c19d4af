"""The ``conveyor`` command: rich output for people, ``--json`` for scripts.

Every command takes ``--url`` (default ``CONVEYOR_URL``) and ``--schema``
(default ``CONVEYOR_SCHEMA``, then ``conveyor``); ``worker`` (and ``enqueue
--app``) use the app's own store unless ``--url``/``--schema`` are given. A failed operation prints
one line (``error: ...``) to stderr and exits 1; a malformed command line
gets click's usage message and exit code 2.
"""

from __future__ import annotations

import importlib
import json
import logging
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, NoReturn, TypeVar

import click
from rich.console import Console
from rich.table import Table

from conveyor.app import App
from conveyor.errors import BackendUnavailableError, ConveyorError
from conveyor.logs import configure_logging
from conveyor.model import Attempt, Message, Task
from conveyor.options import EnqueueOptions

F = TypeVar("F", bound=Callable[..., Any])
console = Console()
EXIT_ERROR = 1
EXIT_UNAVAILABLE = 2
"""The exit code of a command that could not reach its store."""


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def task_json(task: Task, with_attempts: bool) -> dict[str, Any]:
    """The documented JSON shape of a task (``show``, ``tasks``)."""
    data: dict[str, Any] = {
        "id": task.id,
        "name": task.name,
        "queue": task.queue,
        "state": task.state.value,
        "priority": task.priority,
        "run_at": _iso(task.run_at),
        "result": task.result,
        "payload": task.payload,
        "attempt": task.attempt,
        "max_attempts": task.max_attempts,
        "timeout": task.timeout,
        "lease": task.lease,
        "created_at": _iso(task.created_at),
        "finished_at": _iso(task.finished_at),
        "worker_id": task.worker_id,
        "lease_expires_at": _iso(task.lease_expires_at),
        "cancel_requested": task.cancel_requested,
        "step": task.step,
        "parent_id": task.parent_id,
        "inbox": task.inbox,
        "idempotency_key": task.idempotency_key,
    }
    if with_attempts:
        data["attempts"] = [attempt_json(a) for a in task.attempts]
    return data


def message_json(message: Message) -> dict[str, Any]:
    """The JSON shape of an unread inbox message (``show``)."""
    return {
        "id": message.id,
        "kind": message.kind.value,
        "sender_id": message.sender_id,
        "body": message.body,
        "created_at": _iso(message.created_at),
    }


def attempt_json(attempt: Attempt) -> dict[str, Any]:
    return {
        "number": attempt.number,
        "step": attempt.step,
        "worker_id": attempt.worker_id,
        "outcome": attempt.outcome.value,
        "error_type": attempt.error_type,
        "error_message": attempt.error_message,
        "traceback": attempt.traceback,
        "started_at": _iso(attempt.started_at),
        "finished_at": _iso(attempt.finished_at),
    }


def load_app(spec: str) -> App:
    """Import ``MODULE:ATTR`` and return the App it names."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise click.BadParameter(f"expected MODULE:ATTR, got {spec!r}")
    if "" not in sys.path:
        sys.path.insert(0, "")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise click.BadParameter(f"cannot import {module_name!r}: {exc}") from exc
    app = getattr(module, attr, None)
    if not isinstance(app, App):
        raise click.BadParameter(f"{spec!r} is not a conveyor.App")
    return app


def backend_options(fn: F) -> F:
    fn = click.option("--schema", envvar="CONVEYOR_SCHEMA", help="PostgreSQL schema.")(fn)
    fn = click.option("--url", envvar="CONVEYOR_URL", help="Backend URL (CONVEYOR_URL).")(fn)
    return fn


def json_option(fn: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON.")(fn)


def _client(url: str | None, schema: str | None, app_spec: str | None = None) -> App:
    if app_spec:
        app = load_app(app_spec)
        if url is not None or schema is not None:
            app.rebind(url, schema=schema)
        return app
    return App(url, schema=schema, allow_unregistered=True)


def _fail(problem: str | BaseException) -> NoReturn:
    """One line on stderr; exit 2 when the store cannot be reached, else 1."""
    click.echo(f"error: {problem}", err=True)
    sys.exit(EXIT_UNAVAILABLE if isinstance(problem, BackendUnavailableError) else EXIT_ERROR)


@click.group()
@click.version_option(package_name="conveyor")
def main() -> None:
    """conveyor: a durable task system."""


@main.command()
@backend_options
def migrate(url: str | None, schema: str | None) -> None:
    """Create or upgrade the schema (idempotent)."""
    try:
        with _client(url, schema) as app:
            applied = app.migrate()
    except ConveyorError as exc:
        _fail(exc)
    click.echo(f"applied {len(applied)} migration(s)" if applied else "schema is up to date")


@main.command()
@click.argument("app_spec", metavar="MODULE:ATTR")
@click.option("--concurrency", "-c", type=click.IntRange(min=1), default=10, show_default=True)
@click.option("--queues", "-q", help="Comma-separated queues (default: the app's).")
@click.option(
    "--lease",
    type=click.FloatRange(min=0.5),
    default=30.0,
    show_default=True,
    help="Lease seconds for tasks that set none.",
)
@click.option(
    "--heartbeat-interval",
    type=click.FloatRange(min=0.01),
    help="Seconds between lease renewals (default: the shortest lease / 3).",
)
@click.option("--poll-interval", type=click.FloatRange(min=0.01), default=1.0, show_default=True)
@click.option(
    "--grace",
    type=click.FloatRange(min=0),
    default=30.0,
    show_default=True,
    help="Seconds to drain on SIGTERM before releasing running tasks.",
)
@click.option("--burst", is_flag=True, help="Exit 0 once no task is due or running.")
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text")
@click.option("--log-level", default="INFO", show_default=True)
@click.option(
    "--url", help="Backend URL, instead of the app's (an App() without one reads CONVEYOR_URL)."
)
@click.option("--schema", help="PostgreSQL schema, instead of the app's (or CONVEYOR_SCHEMA).")
def worker(
    app_spec: str,
    concurrency: int,
    queues: str | None,
    lease: float,
    heartbeat_interval: float | None,
    poll_interval: float,
    grace: float,
    burst: bool,
    log_format: str,
    log_level: str,
    url: str | None,
    schema: str | None,
) -> None:
    """Run a worker for the App at MODULE:ATTR."""
    configure_logging(log_format, log_level)
    try:
        app = _client(url, schema, app_spec)
    except ConveyorError as exc:
        _fail(exc)
    queue_list = [q.strip() for q in queues.split(",") if q.strip()] if queues else None
    try:
        app.run_worker(
            concurrency=concurrency,
            queues=queue_list,
            lease=lease,
            heartbeat_interval=heartbeat_interval,
            poll_interval=poll_interval,
            grace=grace,
            burst=burst,
        )
    except ConveyorError as exc:
        _fail(exc)


@main.command()
@click.argument("name")
@click.option("--args", "args_json", default="{}", help="Payload: a JSON object.")
@click.option("--queue")
@click.option("--priority", type=int)
@click.option("--delay", type=click.FloatRange(min=0), help="Seconds before it is due.")
@click.option("--run-at", help="When it is due: ISO 8601, UTC unless it has an offset.")
@click.option("--max-attempts", type=click.IntRange(min=1))
@click.option("--timeout", type=click.FloatRange(min=0), help="Seconds each attempt may run.")
@click.option("--lease", type=click.FloatRange(min=0), help="Lease seconds of each attempt.")
@click.option(
    "--idempotency-key",
    help="Store at most one task of NAME under this key: repeating the command prints "
    "the first task's id.",
)
@click.option("--app", "app_spec", help="MODULE:ATTR to check the name and payload against.")
@backend_options
@json_option
def enqueue(
    name: str,
    args_json: str,
    queue: str | None,
    priority: int | None,
    delay: float | None,
    run_at: str | None,
    max_attempts: int | None,
    timeout: float | None,
    lease: float | None,
    idempotency_key: str | None,
    app_spec: str | None,
    url: str | None,
    schema: str | None,
    as_json: bool,
) -> None:
    """Enqueue task NAME; prints the new task id (or, with a key already used,
    the stored one's)."""
    from conveyor.model import RetryPolicy

    try:
        args = json.loads(args_json)
    except json.JSONDecodeError as exc:
        _fail(f"--args is not JSON: {exc}")
    if not isinstance(args, dict):
        _fail("--args must be a JSON object")
    due = None
    if run_at is not None:
        try:
            due = datetime.fromisoformat(run_at)
        except ValueError:
            _fail(f"--run-at is not an ISO 8601 time: {run_at!r}")
        if due.tzinfo is None:
            due = due.replace(tzinfo=UTC)
    try:
        options = EnqueueOptions(
            queue=queue,
            priority=priority,
            delay=delay,
            run_at=due,
            retry=RetryPolicy(max_attempts=max_attempts) if max_attempts else None,
            timeout=timeout,
            lease=lease,
            idempotency_key=idempotency_key,
        )
        with _client(url, schema, app_spec) as app:
            handle = app.enqueue(name, args, options=options)
    except ConveyorError as exc:
        _fail(exc)
    click.echo(json.dumps({"id": handle.id}) if as_json else str(handle.id))


@main.command()
@click.option("--state")
@click.option("--name")
@click.option("--queue")
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True)
@click.option("--before", type=int, help="Only tasks with a smaller id: the next page.")
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
    """List tasks, newest first; page on with --before (the last id shown)."""
    try:
        with _client(url, schema) as app:
            found = app.list_tasks(state=state, name=name, queue=queue, limit=limit, before=before)
    except (ConveyorError, ValueError) as exc:
        _fail(exc)
    if as_json:
        click.echo(json.dumps([task_json(t, with_attempts=False) for t in found]))
        return
    table = Table("id", "name", "queue", "state", "priority", "attempt", "run_at")
    for t in found:
        table.add_row(
            str(t.id),
            t.name,
            t.queue,
            t.state.value,
            str(t.priority),
            f"{t.attempt}/{t.max_attempts}",
            _iso(t.run_at) or "",
        )
    console.print(table)


@main.command()
@backend_options
@json_option
def counts(url: str | None, schema: str | None, as_json: bool) -> None:
    """Count tasks by state, queue and name."""
    try:
        with _client(url, schema) as app:
            found = app.count_tasks()
    except ConveyorError as exc:
        _fail(exc)
    if as_json:
        rows = [
            {"state": c.state.value, "queue": c.queue, "name": c.name, "count": c.count}
            for c in found
        ]
        click.echo(json.dumps(rows))
        return
    table = Table("state", "queue", "name", "count")
    for c in found:
        table.add_row(c.state.value, c.queue, c.name, str(c.count))
    console.print(table)


@main.command()
@click.argument("task_id", type=int)
@backend_options
@json_option
def show(task_id: int, url: str | None, schema: str | None, as_json: bool) -> None:
    """Show a task with its attempt history."""
    try:
        with _client(url, schema) as app:
            task = app.get(task_id)
            inbox = app.inbox(task_id) if task is not None and task.inbox else []
    except ConveyorError as exc:
        _fail(exc)
    if task is None:
        _fail(f"no task with id {task_id}")
        return
    if as_json:
        data = task_json(task, with_attempts=True)
        if task.inbox:
            data["messages"] = [message_json(m) for m in inbox]
        click.echo(json.dumps(data))
        return
    console.print(
        f"[bold]task {task.id}[/bold] {task.name} on {task.queue}: "
        f"[bold]{task.state.value}[/bold] (priority {task.priority})"
    )
    if task.step is not None:
        console.print(f"step: {task.step}")
    if task.parent_id is not None:
        console.print(f"parent: {task.parent_id}")
    stateful = task.step is not None or task.inbox
    console.print(f"{'state' if stateful else 'payload'}: {json.dumps(task.payload)}")
    if task.inbox:
        console.print(f"inbox: {len(inbox)} unread message(s)")
        for m in inbox:
            sender = f"task {m.sender_id}" if m.sender_id is not None else "outside"
            console.print(f"  {m.id} {m.kind.value} from {sender}: {json.dumps(m.body)}")
    if task.result is not None:
        console.print(f"result: {json.dumps(task.result)}")
    steps = any(a.step is not None for a in task.attempts)
    table = Table(
        "#", *(["step"] if steps else []), "worker", "outcome", "started", "finished", "error"
    )
    for a in task.attempts:
        error = f"{a.error_type}: {a.error_message}" if a.error_type else ""
        table.add_row(
            str(a.number),
            *([a.step or ""] if steps else []),
            a.worker_id,
            a.outcome.value,
            _iso(a.started_at) or "",
            _iso(a.finished_at) or "",
            error,
        )
    console.print(table)
    last = task.last_attempt
    if last is not None and last.traceback:
        console.print(last.traceback, markup=False, highlight=False)


def _transition(action: str, task_id: int, url: str | None, schema: str | None) -> None:
    try:
        with _client(url, schema) as app:
            state = app.cancel(task_id) if action == "cancel" else app.retry(task_id)
    except ConveyorError as exc:
        _fail(exc)
    click.echo(f"task {task_id}: {state.value}")


@main.command()
@click.argument("task_id", type=int)
@click.option("--json", "message_json", required=True, help="The message, as JSON text.")
@click.option(
    "--idempotency-key",
    help="Send at most once under this key: repeating the command prints the first id.",
)
@backend_options
def send(
    task_id: int,
    message_json: str,
    idempotency_key: str | None,
    url: str | None,
    schema: str | None,
) -> None:
    """Send a message to coroutine task TASK_ID (it wakes if it waits); prints its id."""
    try:
        message = json.loads(message_json)
    except json.JSONDecodeError as exc:
        _fail(f"--json is not JSON: {exc}")
    try:
        with _client(url, schema) as app:
            message_id = app.send(task_id, message, idempotency_key=idempotency_key)
    except ConveyorError as exc:
        _fail(exc)
    click.echo(f"message {message_id} sent to task {task_id}")


@main.command()
@click.argument("task_id", type=int)
@backend_options
def cancel(task_id: int, url: str | None, schema: str | None) -> None:
    """Cancel a task (a running one is told at once and stops within about a second)."""
    _transition("cancel", task_id, url, schema)


@main.command()
@click.argument("task_id", type=int)
@backend_options
def retry(task_id: int, url: str | None, schema: str | None) -> None:
    """Run a failed or cancelled task again."""
    _transition("retry", task_id, url, schema)


@main.command()
@backend_options
@json_option
def workers(url: str | None, schema: str | None, as_json: bool) -> None:
    """List workers with their last heartbeat."""
    try:
        with _client(url, schema) as app:
            found = app.list_workers()
    except ConveyorError as exc:
        _fail(exc)
    if as_json:
        click.echo(
            json.dumps(
                [
                    {
                        "id": w.id,
                        "host": w.host,
                        "pid": w.pid,
                        "queues": list(w.queues),
                        "concurrency": w.concurrency,
                        "started_at": _iso(w.started_at),
                        "last_seen_at": _iso(w.last_seen_at),
                        "stopped_at": _iso(w.stopped_at),
                    }
                    for w in found
                ]
            )
        )
        return
    table = Table("id", "host", "pid", "queues", "slots", "last seen", "stopped")
    for w in found:
        table.add_row(
            w.id,
            w.host,
            str(w.pid),
            ",".join(w.queues),
            str(w.concurrency),
            _iso(w.last_seen_at) or "",
            _iso(w.stopped_at) or "",
        )
    console.print(table)


@main.command()
@click.option("--url", envvar="CONVEYOR_URL", help="Backend URL (CONVEYOR_URL).")
def demo(url: str | None) -> None:
    """Run a worker on a few example tasks and show what happened.

    Needs no database server: with no URL it runs on a temporary SQLite file.
    On PostgreSQL it uses a throwaway schema of its own, dropped at the end.
    """
    import asyncio

    from conveyor.demo import print_report, run_demo

    try:
        finished = asyncio.run(run_demo(url, console))
    except ConveyorError as exc:
        _fail(exc)
    print_report(finished, console)


logging.getLogger("conveyor").addHandler(logging.NullHandler())

if __name__ == "__main__":
    main()
