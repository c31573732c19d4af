"""The commands that run or prepare the store: ``worker``, ``migrate``, ``demo``."""

from __future__ import annotations

import asyncio
import logging

import click

from conveyor.app import App
from conveyor.cli.common import (
    URL_HELP,
    backend_options,
    console,
    fail,
    open_client,
)
from conveyor.errors import ConveyorError
from conveyor.logs import LEVELS, configure_logging
from conveyor.worker import Worker
from conveyor.worker.collector import DEFAULT_THRESHOLD, tune_collector

log = logging.getLogger("conveyor.worker")


@click.command()
@click.option(
    "--sql",
    "print_sql",
    is_flag=True,
    help="Print the SQL of the pending migrations for review; apply nothing.",
)
@backend_options
def migrate(url: str | None, schema: str | None, print_sql: bool) -> None:
    """Create or upgrade the schema (idempotent); creates a SQLite file."""
    try:
        if print_sql:
            status = asyncio.run(open_client(url, schema).store_status_async(workers=False))
            pending = status.pending
        else:
            with open_client(url, schema, create=True) as app:
                applied = app.migrate()
    except ConveyorError as exc:
        fail(exc)
    if print_sql:
        for migration in pending:
            click.echo(f"-- {migration.name}\n{migration.script}")
        if not pending:
            click.echo("-- the schema is up to date: nothing to apply")
        return
    click.echo(f"applied {len(applied)} migration(s)" if applied else "schema is up to date")


@click.command()
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
@click.option(
    "--log-level",
    type=click.Choice(LEVELS, case_sensitive=False),
    default="INFO",
    show_default=True,
)
@click.option("--quiet", is_flag=True, help="Do not log each finished attempt at INFO.")
@click.option(
    "--no-prune", is_flag=True, help="Never delete finished tasks (retention is off here)."
)
@click.option(
    "--no-schedules", is_flag=True, help="Neither sync nor fire the app's schedules here."
)
@click.option(
    "--no-wakeup-turns",
    is_flag=True,
    help="Answer every wake-up with a claim, instead of taking turns with the idle "
    "workers of the same queues and tasks (PostgreSQL).",
)
@click.option(
    "--no-handoffs",
    is_flag=True,
    help="Offer no idle slots for enqueues to fill directly; claim every task (PostgreSQL).",
)
@click.option(
    "--work-connections",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="PostgreSQL connections for the worker's own statements; it holds one more "
    "(LISTEN, turns, heartbeats and, with 1, its claims).",
)
@click.option(
    "--process-pool",
    type=click.IntRange(min=0),
    help="Idle handler processes kept for process=True tasks (default: the CPU count; "
    "0: a fresh process per attempt).",
)
@click.option(
    "--url",
    help="Backend URL, instead of the app's (an App() without one reads CONVEYOR_URL). "
    "Every local user can read a command line: keep a password out of it "
    "(CONVEYOR_URL; for PostgreSQL ~/.pgpass or PGPASSWORD).",
)
@click.option("--schema", help="PostgreSQL schema, instead of the app's (or CONVEYOR_SCHEMA).")
@click.option(
    "--gc-threshold",
    type=click.IntRange(min=0),
    default=DEFAULT_THRESHOLD,
    show_default=True,
    help="Freeze what lives at start and collect the youngest generation of garbage after "
    "this many allocations (0: leave Python's collector as it is).",
)
@click.option(
    "--no-migrate",
    is_flag=True,
    help="Never create or upgrade the store (no DDL): refuse one that is missing or behind "
    "(run `conveyor migrate` at deploy, with a role that may).",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(min=0, max=65535),
    help="Serve Prometheus metrics on this port (/metrics; the metrics extra).",
)
@click.option(
    "--metrics-addr",
    default="0.0.0.0",  # noqa: S104 - a scrape target, reached from the Prometheus server
    show_default=True,
    help="The metrics address (every interface by default: names and counts, no payloads).",
)
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
    quiet: bool,
    no_prune: bool,
    no_schedules: bool,
    no_wakeup_turns: bool,
    no_handoffs: bool,
    work_connections: int,
    process_pool: int | None,
    url: str | None,
    schema: str | None,
    gc_threshold: int,
    no_migrate: bool,
    metrics_port: int | None,
    metrics_addr: str,
) -> None:
    """Run a worker for the App at MODULE:ATTR; it creates or upgrades the
    store (a SQLite file too) unless --no-migrate or the app says not. It
    also fires the app's schedules and prunes finished tasks past their age
    (succeeded 1 day, failed and cancelled 14 days) unless told not to."""
    configure_logging(log_format, log_level)
    try:
        app = open_client(url, schema, app_spec, create=True)
        if no_migrate:
            app.rebind(migrate=False)
    except ConveyorError as exc:
        fail(exc)
    queue_list = [q.strip() for q in queues.split(",") if q.strip()] if queues else None
    try:
        running = app.worker(
            concurrency=concurrency,
            queues=queue_list,
            lease=lease,
            heartbeat_interval=heartbeat_interval,
            poll_interval=poll_interval,
            grace=grace,
            burst=burst,
            log_attempts=not quiet,
            schedules=not no_schedules,
            process_pool=process_pool,
            work_connections=work_connections,
            wakeup_turns=not no_wakeup_turns,
            handoffs=not no_handoffs,
            **({"retention": None} if no_prune else {}),
        )
        if metrics_port is not None:
            serve_metrics(app, running, metrics_port, metrics_addr)
        if gc_threshold:
            tune_collector(gc_threshold)  # last: everything built so far is frozen
        asyncio.run(running.run())
    except ConveyorError as exc:
        fail(exc)


def serve_metrics(app: App, running: Worker, port: int, addr: str) -> None:
    """Count ``app``'s events and ``running``'s slots; answer scrapes on ``addr:port``."""
    from conveyor.metrics import Metrics  # the metrics extra: imported only when asked

    metrics = Metrics()
    metrics.observe(app.events)
    metrics.track(running)
    metrics.serve(port, addr)
    log.info("metrics on http://%s:%d/metrics", addr, port)


@click.command()
@click.option("--url", envvar="CONVEYOR_URL", help=URL_HELP)
def demo(url: str | None) -> None:
    """Run a worker on a few example tasks and show what happened.

    Needs no database server: with no URL it runs on a temporary SQLite file.
    On PostgreSQL it uses a throwaway schema of its own, dropped at the end.
    """
    from conveyor.demo import print_report, run_demo

    try:
        finished = asyncio.run(run_demo(url, console))
    except ConveyorError as exc:
        fail(exc)
    print_report(finished, console)
