"""What every command shares: the store it opens, its one-line errors, the
options it takes, and how it shows times.

Every command takes ``--url`` (default ``CONVEYOR_URL``) and ``--schema``
(default ``CONVEYOR_SCHEMA``, then ``conveyor``). A failed operation prints
one line (``error: ...``) to stderr and exits 1; a store that cannot be
reached (a PostgreSQL server down) or is not there (a SQLite file that does
not exist, a schema or key prefix that holds no store, or one whose
migrations are behind) exits 2, like a malformed command line (click's
usage message).

Only ``migrate``, ``worker`` and ``demo`` create or upgrade a store: every
other command opens it with ``migrate=False``, which reads the store's
migration record and writes nothing (so a read-only role can run them).
"""

from __future__ import annotations

import asyncio
import importlib
import json
import re
import sys
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any, NoReturn, TypeVar

import click
from rich.console import Console

from conveyor.app import App
from conveyor.cli.text import shown
from conveyor.errors import (
    BackendUnavailableError,
    ConfigurationError,
    ConveyorError,
    StoreNotReadyError,
)
from conveyor.model import TaskState, parse_task_id
from conveyor.records import WorkerInfo

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")
EXIT_ERROR = 1
EXIT_UNAVAILABLE = 2
"""The exit code of a command that could not reach its store."""
APP_ENV = "CONVEYOR_APP"
PIPE_WIDTH = 10_000
"""Columns of output that goes to a pipe or a file: tables are never cut."""

console = Console(
    width=None if sys.stdout.isatty() else PIPE_WIDTH, markup=False, highlight=False, emoji=False
)
"""Standard output of the commands. It reads no markup, emoji code or
highlight in what it prints: stored text goes in as :func:`~conveyor.cli.text.plain`
Text (control characters escaped), our own styles as Text too."""
errors = Console(
    stderr=True,
    width=None if sys.stderr.isatty() else PIPE_WIDTH,
    markup=False,
    highlight=False,
    emoji=False,
)

STATES = [state.value for state in TaskState]
state_choice = click.Choice(STATES, case_sensitive=False)


class TaskIdType(click.ParamType[int]):
    """A task id on the command line, by :func:`conveyor.model.parse_task_id`
    (ASCII digits only), so a bad one is a usage error, never a crash."""

    name = "task id"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        try:
            return parse_task_id(value, "the value")
        except ConfigurationError as exc:
            self.fail(str(exc), param, ctx)


TASK_ID = TaskIdType()


def fail(problem: str | BaseException) -> NoReturn:
    """One line on stderr (control characters escaped: it may quote stored
    text); exit 2 when the store cannot be reached or is not there, else 1."""
    click.echo(f"error: {shown(problem)}", err=True)
    missing = isinstance(problem, BackendUnavailableError | StoreNotReadyError)
    sys.exit(EXIT_UNAVAILABLE if missing else EXIT_ERROR)


def warn(text: str) -> None:
    """One line on stderr, control characters escaped (it may quote stored text)."""
    click.echo(f"warning: {shown(text)}", err=True)


def load_app(spec: str) -> App:
    """Import ``MODULE:ATTR`` and return the App it names; a usage error that
    says what is wrong otherwise."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise click.BadParameter(f"expected MODULE:ATTR, got {spec!r}")
    if "" not in sys.path:
        sys.path.insert(0, "")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module_name.startswith(exc.name):
            raise click.BadParameter(f"no module named {module_name!r}") from exc
        raise
    if not hasattr(module, attr):
        raise click.BadParameter(f"module {module_name!r} has no attribute {attr!r}")
    app = getattr(module, attr)
    if not isinstance(app, App):
        raise click.BadParameter(f"{spec!r} is a {type(app).__name__}, not a conveyor.App")
    return app


URL_HELP = (
    "Backend URL (CONVEYOR_URL). Every local user can read a command line: "
    "keep a password out of it (CONVEYOR_URL; for PostgreSQL ~/.pgpass or PGPASSWORD)."
)


def backend_options(fn: F) -> F:
    fn = click.option("--schema", envvar="CONVEYOR_SCHEMA", help="PostgreSQL schema.")(fn)
    fn = click.option("--url", envvar="CONVEYOR_URL", help=URL_HELP)(fn)
    return fn


def json_option(fn: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON.")(fn)


def open_client(
    url: str | None, schema: str | None, app_spec: str | None = None, *, create: bool = False
) -> App:
    """The client of a command: the app at ``app_spec`` (rebound to ``url``
    and ``schema`` when given), else a client that takes any task name.

    Unless ``create``, the client never creates or upgrades the store
    (``migrate=False``): a SQLite file that does not exist, a schema or key
    prefix that holds no store, or one behind, is refused with
    StoreNotReadyError (exit code 2) rather than created empty: a typo in a
    path or a schema, or a relative path run from another directory, would
    otherwise show an empty store."""
    if app_spec:
        app = load_app(app_spec)
        if url is not None or schema is not None:
            app.rebind(url, schema=schema)
        if not create:
            app.rebind(migrate=False)
    else:
        app = App(url, schema=schema, allow_unregistered=True, migrate=create)
    if not create:
        app.check_exists()
    return app


def check_store(app: App) -> None:
    """Raise StoreNotReadyError unless ``app``'s store is there and current
    (read on a connection of its own, closed after): for a command that
    serves the store (the dashboard) and must refuse a missing one at start."""
    asyncio.run(app.check_ready_async())


def with_client(url: str | None, schema: str | None, use: Callable[[App], T]) -> T:
    """What ``use`` returns, given the client of a command (see
    :func:`open_client`); a ConveyorError ends the command (:func:`fail`)."""
    try:
        with open_client(url, schema) as app:
            return use(app)
    except ConveyorError as exc:
        fail(exc)


def parse_json(text: str, what: str) -> Any:
    """``text`` decoded as JSON; a command line that is not JSON, or nested
    too deeply for Python to decode, ends the command with one line."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        fail(f"{what} is not JSON: {exc}")
    except RecursionError:
        fail(f"{what} is nested too deeply to decode")


def parse_duration(text: str) -> float | None:
    """Seconds of a duration such as ``90s``, ``15m``, ``2h``, ``7d``; None
    if ``text`` is not one."""
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd])\s*", text)
    if not found:
        return None
    return float(found.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[found.group(2)]


def parse_time(text: str, now: datetime, option: str) -> datetime:
    """An ISO 8601 time (UTC unless it has an offset), or a duration before
    ``now``: ``90s``, ``15m``, ``2h``, ``7d`` (one that reaches before the
    year 1 ends the command with one line)."""
    seconds = parse_duration(text)
    if seconds is not None:
        try:
            return now - timedelta(seconds=seconds)
        except OverflowError:
            fail(f"{option} reaches back before the year 1: {text[:40]!r}")
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        fail(f"{option} is neither an ISO 8601 time nor a duration like 15m: {text!r}")
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def unserved(
    pairs: Iterable[tuple[str, str]], workers: Iterable[WorkerInfo], now: datetime
) -> list[tuple[str, str]]:
    """The (name, queue) pairs that no live worker serves, in order."""
    live = [w for w in workers if w.live(now)]
    return [
        pair for pair in dict.fromkeys(pairs) if not any(w.serves(pair[0], pair[1]) for w in live)
    ]


def serving(workers: Iterable[WorkerInfo], now: datetime) -> str:
    """What the live workers serve, in a few words."""
    live = [w for w in workers if w.live(now)]
    if not live:
        return "no worker is live"
    queues = sorted({q for w in live for q in w.queues})
    return f"{len(live)} live worker(s) serve queues {', '.join(queues)}"
