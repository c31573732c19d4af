"""The operator's ``conveyor``: missing stores, unserved tasks, due times,
live workers, health, reviewed migrations, bulk retry and cancel, and the
worker's own lines; run for real in subprocesses on PostgreSQL and SQLite."""

from __future__ import annotations

import functools
import json
import signal
import sqlite3
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

import conveyor
from conveyor.records import WorkerInfo
from tests.cli_harness import ROOT, Cli
from tests.conftest import CLI_ON_REDIS, drop_schema
from tests.test_cli import APP

SQLITE_ONLY = pytest.mark.parametrize("cli", ["sqlite"], indirect=True)


def kind(cli: Cli) -> str:
    return "postgres" if cli.env["CONVEYOR_URL"].startswith("postgresql") else "sqlite"


def register(cli: Cli, worker: WorkerInfo, *, stopped: bool = False) -> None:
    """Enter a worker in the store's workers table, as a worker process does."""
    client = conveyor.App(cli.env["CONVEYOR_URL"], schema=cli.env["CONVEYOR_SCHEMA"])

    async def enter() -> None:
        backend = await client.backend()
        await backend.register_worker(worker)
        if stopped:
            await backend.stop_worker(worker.id)

    try:
        client.portal.run(enter())
    finally:
        client.close()


def a_worker(name: str, queues: tuple[str, ...], tasks: tuple[str, ...]) -> WorkerInfo:
    return WorkerInfo(
        id=name, host="h", pid=1, queues=queues, concurrency=4, tasks=tasks, beat_seconds=10.0
    )


# -- the SQLite file -----------------------------------------------------------


@SQLITE_ONLY
@pytest.mark.parametrize(
    "command",
    [
        ("tasks",),
        ("counts",),
        ("show", "1"),
        ("workers",),
        ("health",),
        ("cancel", "1"),
        ("enqueue", "add"),
        ("migrate", "--sql"),
    ],
)
def test_a_missing_sqlite_file_is_refused_not_created(
    cli: Cli, tmp_path: Path, command: tuple[str, ...]
) -> None:
    cli.env["CONVEYOR_URL"] = "sqlite:///typo.db"  # relative: to the working directory
    done = cli.run(*command)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (
        f"error: no SQLite database at {ROOT / 'typo.db'} (check --url or CONVEYOR_URL; "
        "`conveyor migrate` or a worker creates it)"
    )
    assert not (ROOT / "typo.db").exists()


@SQLITE_ONLY
def test_migrate_and_the_worker_create_the_file(cli: Cli, tmp_path: Path) -> None:
    made = tmp_path / "made.db"
    cli.ok("migrate", "--url", f"sqlite:///{made}")
    assert made.exists()
    other = tmp_path / "other.db"
    cli.env["CONVEYOR_URL"] = f"sqlite:///{other}"
    done = cli.run("worker", APP, "--burst", "--log-level", "INFO")
    assert done.returncode == 0, done.stderr
    assert other.exists()
    assert f"sqlite:///{other}" in done.stderr.splitlines()[0]  # the absolute path


# -- unserved tasks, due times, live workers -------------------------------------


def test_enqueue_warns_when_no_live_worker_serves_the_task(cli: Cli) -> None:
    done = cli.run("enqueue", "add", "--args", '{"a": 1, "b": 2}')
    assert done.returncode == 0 and done.stdout.strip().isdigit()
    assert "warning: no live worker serves task 'add' on queue 'default'" in done.stderr

    register(cli, a_worker("w-mail", ("mail",), ("notify",)))
    done = cli.run("enqueue", "add", "--args", '{"a": 1, "b": 2}')
    assert "no live worker serves task 'add' on queue 'default'" in done.stderr
    assert "1 live worker(s) serve queues mail" in done.stderr

    register(cli, a_worker("w-default", ("default",), ("add", "explode")))
    done = cli.run("enqueue", "add", "--args", '{"a": 1, "b": 2}')
    assert (done.returncode, done.stderr) == (0, "")
    done = cli.run("enqueue", "typo_name")  # the queue is served, the name is not
    assert "no live worker serves task 'typo_name' on queue 'default'" in done.stderr

    register(cli, a_worker("w-default", ("default",), ("add",)), stopped=True)
    done = cli.run("enqueue", "add", "--args", '{"a": 1, "b": 2}')
    assert "no live worker serves task 'add'" in done.stderr  # a stopped worker serves nothing


def test_enqueue_with_the_app_uses_the_task_declared_options(cli: Cli) -> None:
    plain = cli.enqueue("notify", {"to": "ada"})
    task = cli.show(plain)
    assert (task["queue"], task["timeout"]) == ("default", None)

    cli.env["CONVEYOR_APP"] = APP
    declared = cli.enqueue("notify", {"to": "ada"})
    task = cli.show(declared)
    assert (task["queue"], task["max_attempts"], task["timeout"]) == ("mail", 7, 30)
    overridden = cli.enqueue("notify", {"to": "ada"}, "--queue", "urgent")
    assert cli.show(overridden)["queue"] == "urgent"
    error = cli.fails("enqueue", "notify", "--args", '{"to": 5, "cc": 1}')
    assert "cc" in error  # checked against the handler before anything is stored


def test_show_and_tasks_say_when_a_pending_task_is_due(cli: Cli) -> None:
    task_id = cli.enqueue("add", {"a": 1, "b": 2}, "--delay", "3600")
    data = cli.show(task_id)
    due = datetime.fromisoformat(data["due_at"])
    assert due == datetime.fromisoformat(data["run_at"])
    assert 3500 < (due - datetime.now(UTC)).total_seconds() <= 3600
    text = cli.ok("show", str(task_id))
    assert "due: in 59 m" in text or "due: in 1 h" in text
    assert "no live worker serves 'add' on queue 'default'" in text
    listing = cli.run("tasks")
    assert "in 59 m" in listing.stdout or "in 1 h" in listing.stdout
    assert "no live worker serves task 'add' on queue 'default'" in listing.stderr

    register(cli, a_worker("w", ("default",), ("add",)))
    assert "no live worker" not in cli.ok("show", str(task_id))
    assert cli.run("tasks").stderr == ""


@CLI_ON_REDIS
def test_workers_lists_live_workers_unless_asked_for_all(cli: Cli) -> None:
    register(cli, a_worker("live-one", ("default", "mail"), ("add", "notify")))
    register(cli, a_worker("gone-one", ("default",), ("add",)), stopped=True)
    [live] = cli.json("workers")
    assert (live["id"], live["queues"], live["tasks"], live["live"]) == (
        "live-one",
        ["default", "mail"],
        ["add", "notify"],
        True,
    )
    every = {w["id"]: w["live"] for w in cli.json("workers", "--all")}
    assert every == {"live-one": True, "gone-one": False}
    text = cli.ok("workers")
    assert "live-one" in text and "gone-one" not in text and "--all" in text


def test_a_real_worker_records_its_tasks_and_queues(cli: Cli) -> None:
    cli.ok("worker", APP, "--burst", "--queues", "default,mail")
    [worker] = cli.json("workers", "--all")
    assert worker["queues"] == ["default", "mail"]
    assert {"add", "explode", "notify", "greeting", "echo"} <= set(worker["tasks"])
    assert worker["live"] is False  # a burst worker has stopped


# -- health ----------------------------------------------------------------------


@CLI_ON_REDIS
def test_health_exit_codes(cli: Cli) -> None:
    cli.ok("migrate")
    done = cli.run("health")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "workers: 0 live (at least 1 needed)" in done.stdout
    assert "schema: current" in done.stdout
    report = json.loads(cli.ok("health", "--min-workers", "0", "--json"))
    assert (report["healthy"], report["pending_migrations"], report["workers"]) == (True, [], [])
    register(cli, a_worker("w", ("default",), ("add",)))
    assert "1 live" in cli.ok("health")


def test_health_reports_a_schema_behind_without_migrating_it(
    cli: Cli, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if kind(cli) == "postgres":
        cli.env["CONVEYOR_SCHEMA"] += "_new"
        request.addfinalizer(functools.partial(drop_schema, cli.env["CONVEYOR_SCHEMA"]))
    else:
        fresh = tmp_path / "fresh.db"
        sqlite3.connect(fresh).close()
        cli.env["CONVEYOR_URL"] = f"sqlite:///{fresh}"
    done = cli.run("health", "--min-workers", "0", "--json")
    assert done.returncode == 1
    report = json.loads(done.stdout)
    assert report["pending_migrations"][0].startswith("0001_")
    again = json.loads(cli.run("health", "--min-workers", "0", "--json").stdout)
    assert again["pending_migrations"] == report["pending_migrations"]  # nothing applied


def test_health_of_an_unreachable_server_exits_2(cli: Cli) -> None:
    if kind(cli) == "sqlite":
        pytest.skip("a SQLite file is reachable when it exists")
    cli.env["CONVEYOR_URL"] = "postgresql://root:secret@127.0.0.1:1/test?connect_timeout=2"
    done = cli.run("health")
    assert done.returncode == 2
    assert done.stderr.startswith("error: cannot connect to postgresql://root:***@127.0.0.1:1")
    assert "secret" not in done.stderr


# -- migrate --sql ---------------------------------------------------------------


def test_migrate_sql_prints_a_script_that_applies_the_schema(
    cli: Cli, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if kind(cli) == "postgres":
        cli.env["CONVEYOR_SCHEMA"] += "_dba"
        # Not the fixture's schema: this test drops it itself.
        request.addfinalizer(functools.partial(drop_schema, cli.env["CONVEYOR_SCHEMA"]))
        script = cli.ok("migrate", "--sql")
        applied = subprocess.run(
            ["psql", "-v", "ON_ERROR_STOP=1", "-q", cli.env["CONVEYOR_URL"]],
            input=script,
            capture_output=True,
            text=True,
            check=False,
        )
        assert applied.returncode == 0, applied.stderr
    else:
        fresh = tmp_path / "dba.db"
        sqlite3.connect(fresh).close()
        cli.env["CONVEYOR_URL"] = f"sqlite:///{fresh}"
        script = cli.ok("migrate", "--sql")
        with sqlite3.connect(fresh, isolation_level=None) as conn:
            conn.executescript(script)
        conn.close()
    assert "-- 0001_initial.sql" in script
    assert cli.ok("migrate").strip() == "schema is up to date"
    assert cli.ok("migrate", "--sql").strip() == "-- the schema is up to date: nothing to apply"
    cli.enqueue("add", {"a": 1, "b": 2})  # the reviewed schema works


# -- bulk retry and cancel -------------------------------------------------------


@CLI_ON_REDIS
def test_bulk_retry_and_cancel_by_filter(cli: Cli) -> None:
    failing = [cli.enqueue("explode", {"message": "x"}, "--max-attempts", "1") for _ in range(4)]
    other = cli.enqueue("add", {"a": 1, "b": 2}, "--delay", "3600")
    cli.ok("worker", APP, "--burst", "--poll-interval", "0.05", "--log-level", "WARNING")
    assert {cli.show(i)["state"] for i in failing} == {"failed"}

    dry = cli.ok("retry", "--state", "failed", "--name", "explode", "--dry-run")
    assert dry.startswith("would retry 4 task(s): ")
    assert {cli.show(i)["state"] for i in failing} == {"failed"}  # a dry run changes nothing
    done = cli.ok("retry", "--state", "failed", "--name", "explode", "--since", "1h")
    assert done.strip() == "retried 4 task(s)"
    assert {cli.show(i)["state"] for i in failing} == {"pending"}

    assert cli.ok("cancel", "--queue", "default", "--until", "1h", "--dry-run").startswith(
        "would cancel 0 task(s)"
    )
    done = cli.ok("cancel", "--queue", "default", "--state", "pending")
    assert done.strip() == "cancelled 5 task(s)"
    assert cli.show(other)["state"] == "cancelled"

    assert "give task ids or a filter" in cli.fails("cancel")
    assert "not both" in cli.fails("cancel", str(other), "--state", "pending")
    assert "--since" in cli.fails("retry", "--state", "failed", "--since", "yesterday")


def test_tables_printed_to_a_pipe_are_not_cut(cli: Cli) -> None:
    name = "a_rather_long_task_name_" * 6
    cli.enqueue(name, {}, "--queue", "a_queue_with_a_long_name_too")
    listing = cli.run("tasks").stdout
    assert name in listing and "a_queue_with_a_long_name_too" in listing


# -- the worker's own lines ------------------------------------------------------


def test_worker_first_line_names_its_store_queues_tasks_and_slots(cli: Cli) -> None:
    if kind(cli) == "postgres":
        cli.env["CONVEYOR_URL"] = cli.env["CONVEYOR_URL"].replace("://", "://root:pw@", 1)
    done = cli.run("worker", APP, "--burst", "--concurrency", "3", "--queues", "default")
    assert done.returncode == 0, done.stderr
    first = done.stderr.splitlines()[0]
    if kind(cli) == "postgres":
        assert "postgresql://root:***@" in first and "pw" not in first
        assert f"(schema {cli.env['CONVEYOR_SCHEMA']})" in first
    else:
        assert "sqlite:////" in first  # an absolute path
    assert "queues default; tasks add, echo, explode, greeting, notify; 3 slots" in first


def test_worker_usage_errors_are_one_line(cli: Cli) -> None:
    assert "module 'tests.apps.cli_app' has no attribute 'nope'" in cli.usage_error(
        "worker", "tests.apps.cli_app:nope"
    )
    assert "no module named 'tests.apps.nothing'" in cli.usage_error(
        "worker", "tests.apps.nothing:app"
    )
    error = cli.usage_error("worker", APP, "--log-level", "LOUD")
    assert "'LOUD' is not one of" in error and "'debug'" in error
    cli.env["CONVEYOR_URL"] = "mysql://nowhere/db"
    assert "unsupported backend URL scheme 'mysql'" in cli.fails("tasks")


def test_sigusr1_logs_what_a_running_worker_does(cli: Cli) -> None:
    worker = subprocess.Popen(
        [sys.executable, "-m", "conveyor.cli", "worker", APP, "--log-level", "INFO"],
        cwd=ROOT,
        env=cli.env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert worker.stderr is not None
        first = worker.stderr.readline()
        assert " on " in first and "slots" in first
        time.sleep(0.5)  # past the signal handlers' installation, which follows the line
        lines: list[str] = []
        deadline = time.monotonic() + 30
        while not any("asyncio tasks:" in line for line in lines):
            assert time.monotonic() < deadline, "".join(lines)
            worker.send_signal(signal.SIGUSR1)
            lines.append(worker.stderr.readline())
        worker.send_signal(signal.SIGTERM)
        # Read through the same buffered file: communicate() with a timeout
        # would read the pipe beneath it and miss what readline() buffered.
        rest = worker.stderr.read()
        worker.wait(timeout=60)
    finally:
        if worker.poll() is None:
            worker.kill()
        worker.wait()
        if worker.stderr is not None:
            worker.stderr.close()
    dump = "".join(lines) + rest
    assert "-- task conveyor-completer" in dump and "-- thread conveyor-heartbeat" in dump
    assert "in claim_loop" in dump  # the frames each task is suspended in
    assert worker.returncode == 0
    assert "stopped" in rest.splitlines()[-1]


def test_finished_attempts_are_logged_with_their_duration_unless_quiet(cli: Cli) -> None:
    first = cli.enqueue("add", {"a": 1, "b": 2})
    done = cli.run("worker", APP, "--burst", "--log-format", "json")
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stderr.splitlines()]
    [ran] = [r for r in records if r.get("task_id") == first]
    assert ran["level"] == "INFO" and ran["message"].startswith(f"task add {first} succeeded in ")
    assert ran["duration"] >= 0 and ran["task_name"] == "add"

    second = cli.enqueue("add", {"a": 1, "b": 2})
    quiet = cli.run("worker", APP, "--burst", "--log-format", "json", "--quiet")
    assert quiet.returncode == 0, quiet.stderr
    logged = [json.loads(line) for line in quiet.stderr.splitlines()]
    assert not [r for r in logged if r.get("task_id") == second]
    assert cli.show(second)["state"] == "succeeded"
