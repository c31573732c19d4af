"""The commands that write: ``enqueue``, ``send``, ``cancel``, ``retry``,
``run-now`` and ``delete``."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import click
from rich.progress import Progress

from conveyor.app import App
from conveyor.cli.common import (
    APP_ENV,
    TASK_ID,
    backend_options,
    console,
    errors,
    fail,
    json_option,
    open_client,
    parse_json,
    parse_time,
    serving,
    state_choice,
    unserved,
    warn,
    with_client,
)
from conveyor.controls import CANCELLABLE
from conveyor.errors import ConveyorError, InvalidTransitionError, TaskNotFoundError
from conveyor.model import TaskState
from conveyor.options import OPTIONS, EnqueueOptions
from conveyor.records import TaskSummary

PAGE = 500
"""Tasks read per page when a bulk command selects them by filter."""
SHOWN_IN_DRY_RUN = 20


def option_flags(command: Callable[..., None]) -> Callable[..., None]:
    """The command-line form of every option that has one
    (:class:`conveyor.options.Flag`), in the options' declared order, each
    passed as its option's name."""
    for name, spec in reversed(OPTIONS):
        flag = spec.flag
        if flag is not None:
            kind: Any = None if flag.kind in (str, datetime) else flag.kind
            if flag.minimum is not None:
                kind = (
                    click.IntRange(min=int(flag.minimum))
                    if flag.kind is int
                    else click.FloatRange(min=flag.minimum)
                )
            command = click.option(flag.name, name, type=kind, help=flag.help)(command)
    return command


def flag_values(flags: dict[str, Any], now: datetime) -> dict[str, Any]:
    """The options given by their flags (a time read as ``--run-at`` is)."""
    values = {}
    for name, spec in OPTIONS:
        flag, value = spec.flag, flags.get(name)
        if flag is None or value is None:
            continue
        if flag.kind is datetime:
            value = parse_time(value, now, flag.name)
        values[name] = flag.to_value(value) if flag.to_value is not None else value
    return values


@click.command()
@click.argument("name")
@click.option("--args", "args_json", default="{}", help="Payload: a JSON object.")
@option_flags
@click.option(
    "--app",
    "app_spec",
    envvar=APP_ENV,
    help="MODULE:ATTR (CONVEYOR_APP): check the name and payload against the app, and "
    "use the task's declared queue, retry policy, timeout and lease.",
)
@backend_options
@json_option
def enqueue(
    name: str,
    args_json: str,
    app_spec: str | None,
    url: str | None,
    schema: str | None,
    as_json: bool,
    **flags: Any,
) -> None:
    """Enqueue task NAME; prints the new task id (or, with a key already used,
    the stored one's).

    Without --app, warns when no live worker serves NAME on its queue."""
    args = parse_json(args_json, "--args")
    if not isinstance(args, dict):
        fail("--args must be a JSON object")
    try:
        options = EnqueueOptions(**flag_values(flags, datetime.now(UTC)))
        with open_client(url, schema, app_spec) as app:
            handle = app.enqueue(name, args, options=options)
            stored = app.get(handle.id) if not app_spec else None
            workers = app.list_workers() if stored is not None else []
    except ConveyorError as exc:
        fail(exc)
    click.echo(json.dumps({"id": handle.id}) if as_json else str(handle.id))
    now = datetime.now(UTC)
    if stored is not None and unserved([(stored.name, stored.queue)], workers, now):
        warn(
            f"no live worker serves task {stored.name!r} on queue {stored.queue!r} "
            f"({serving(workers, now)}); it stays pending until one does "
            "(with --app MODULE:ATTR the task's own queue and options are used)"
        )


@click.command()
@click.argument("task_id", type=TASK_ID)
@click.argument("message")
@click.option(
    "--idempotency-key",
    help="Send at most once under this key: repeating the command prints the first id.",
)
@backend_options
@json_option
def send(
    task_id: int,
    message: str,
    idempotency_key: str | None,
    url: str | None,
    schema: str | None,
    as_json: bool,
) -> None:
    """Send MESSAGE (JSON text) to coroutine task TASK_ID (it wakes if it
    waits); prints the message id."""
    body = parse_json(message, "MESSAGE")
    message_id = with_client(
        url, schema, lambda app: app.send(task_id, body, idempotency_key=idempotency_key)
    )
    if as_json:
        click.echo(json.dumps({"id": message_id, "task_id": task_id}))
    else:
        click.echo(f"message {message_id} sent to task {task_id}")


def filter_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn = click.option("--until", help="Created before: ISO 8601, or a duration ago (15m, 2h).")(fn)
    fn = click.option("--since", help="Created after: ISO 8601, or a duration ago (15m, 2h).")(fn)
    fn = click.option("--queue", help="Tasks of this queue.")(fn)
    fn = click.option("--name", help="Tasks of this name.")(fn)
    fn = click.option("--state", type=state_choice, help="Tasks in this state.")(fn)
    fn = click.option("--dry-run", is_flag=True, help="Only list what would change.")(fn)
    return fn


ACTIONS = {
    "cancel": ("cancelled", CANCELLABLE),
    "retry": ("retried", (TaskState.FAILED, TaskState.CANCELLED)),
    "delete": ("deleted", (TaskState.SUCCEEDED, TaskState.FAILED, TaskState.CANCELLED)),
}
"""Each bulk action: its past tense and the states it takes (without --state)."""


def _selected(
    app: App,
    states: tuple[TaskState, ...],
    name: str | None,
    queue: str | None,
    since: datetime | None,
    until: datetime | None,
) -> Iterator[TaskSummary]:
    """Every task the filters select, newest first, page by page, summarized
    (no payload is read: a dry run's preview may walk every failed task; the
    action itself reads its filter in its own write)."""
    before = None
    state = states[0] if len(states) == 1 else None
    while True:
        page = app.list_summaries(state=state, name=name, queue=queue, limit=PAGE, before=before)
        for task in page:
            if (
                task.state in states
                and (since is None or task.created_at >= since)
                and (until is None or task.created_at < until)
            ):
                yield task
        if len(page) < PAGE:
            return
        before = page[-1].id


def _bulk(
    action: str,
    ids: tuple[int, ...],
    filters: dict[str, Any],
    dry_run: bool,
    url: str | None,
    schema: str | None,
    confirm: Callable[[str], None] | None = None,
) -> None:
    """Cancel, retry or delete the tasks given by id (one by one: one that
    cannot move is counted, not fatal), or every task the filters select:
    in batches in the store, each reading the filters in the same write as
    its action, so a task whose state changed since the command started is
    judged as it is then (a task cancelled meanwhile is not retried by
    --state failed)."""
    now = datetime.now(UTC)
    since = parse_time(filters["since"], now, "--since") if filters["since"] else None
    until = parse_time(filters["until"], now, "--until") if filters["until"] else None
    name, queue, state = filters["name"], filters["queue"], filters["state"]
    if not ids and not (state or name or queue) and since is None and until is None:
        fail(f"give task ids or a filter (--state, --name, --queue, --since, --until) to {action}")
    if ids and (state or name or queue or since or until):
        fail("give task ids or filters, not both")
    past, allowed = ACTIONS[action]
    states = (TaskState(state),) if state else allowed
    if state and states[0] not in allowed:
        *most, last = (s.value for s in allowed)
        fail(f"only {', '.join(most)} or {last} tasks can be {past}, not {state}")
    if confirm is not None and not dry_run:
        confirm(f"task {ids[0]} and its" if len(ids) == 1 else "the tasks selected and their")
    try:
        with open_client(url, schema) as app:
            if not ids:
                if dry_run:
                    targets = [t.id for t in _selected(app, states, name, queue, since, until)]
                    _print_dry_run(action, targets)
                    return
                many = {
                    "cancel": app.cancel_many,
                    "retry": app.retry_many,
                    "delete": app.delete_many,
                }[action]
                done = many(
                    states=states, name=name, queue=queue, since=since, until=until, batch=PAGE
                )
                click.echo(f"{past} {len(done)} task(s)")
                return
            if dry_run:
                _print_dry_run(action, list(ids))
                return
            moved, refused = _apply(app, action, list(ids))
    except ConveyorError as exc:
        fail(exc)
    if len(ids) == 1 and not refused:
        click.echo(f"task {ids[0]}: {moved[0][1]}")
        return
    for _, problem in refused:
        if len(ids) == 1:
            fail(problem)
        warn(problem)
    click.echo(f"{past} {len(moved)} task(s); {len(refused)} could not be {past}")


def _print_dry_run(action: str, targets: list[int]) -> None:
    shown = ", ".join(str(i) for i in targets[:SHOWN_IN_DRY_RUN])
    more = f" and {len(targets) - SHOWN_IN_DRY_RUN} more" if len(targets) > SHOWN_IN_DRY_RUN else ""
    console.print(f"would {action} {len(targets)} task(s){': ' + shown + more if targets else ''}")


def _apply(
    app: App, action: str, targets: list[int]
) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    moved: list[tuple[int, str]] = []
    refused: list[tuple[int, str]] = []
    with Progress(console=errors, transient=True, disable=len(targets) < PAGE) as progress:
        bar = progress.add_task(action, total=len(targets))
        for task_id in targets:
            try:
                if action == "delete":
                    app.delete(task_id)
                    moved.append((task_id, "deleted"))
                else:
                    state: TaskState = (app.cancel if action == "cancel" else app.retry)(task_id)
                    moved.append((task_id, state.value))
            except (InvalidTransitionError, TaskNotFoundError) as exc:
                refused.append((task_id, str(exc)))
            progress.advance(bar)
    return moved, refused


@click.command()
@click.argument("task_ids", type=TASK_ID, nargs=-1)
@filter_options
@backend_options
def cancel(
    task_ids: tuple[int, ...],
    dry_run: bool,
    url: str | None,
    schema: str | None,
    **filters: Any,
) -> None:
    """Cancel tasks: by id, or every pending, waiting or running task the
    filters select. A running one is told at once and stops within about a
    second."""
    _bulk("cancel", task_ids, filters, dry_run, url, schema)


@click.command()
@click.argument("task_ids", type=TASK_ID, nargs=-1)
@filter_options
@backend_options
def retry(
    task_ids: tuple[int, ...],
    dry_run: bool,
    url: str | None,
    schema: str | None,
    **filters: Any,
) -> None:
    """Run failed or cancelled tasks again: by id, or every failed or
    cancelled task the filters select (e.g. --state failed --name send_email
    --since 2h)."""
    _bulk("retry", task_ids, filters, dry_run, url, schema)


@click.command("run-now")
@click.argument("task_id", type=TASK_ID)
@backend_options
def run_now(task_id: int, url: str | None, schema: str | None) -> None:
    """Make pending task TASK_ID due now (its delay, back-off or snooze cut short)."""
    with_client(url, schema, lambda app: app.run_now(task_id))
    click.echo(f"task {task_id}: due now")


@click.command()
@click.argument("task_ids", type=TASK_ID, nargs=-1)
@click.option("--yes", is_flag=True, help="Do not ask first.")
@filter_options
@backend_options
def delete(
    task_ids: tuple[int, ...],
    yes: bool,
    dry_run: bool,
    url: str | None,
    schema: str | None,
    **filters: Any,
) -> None:
    """Delete tasks with their attempt logs and messages, for good: by id
    (not a running one: cancel it first), or every finished task the
    filters select (e.g. --state failed --until 30d)."""

    def ask(what: str) -> None:
        if not yes:
            click.confirm(f"delete {what} history for good?", abort=True, err=True)

    _bulk("delete", task_ids, filters, dry_run, url, schema, ask)
