"""The ``conveyor`` command, run for real in subprocesses on PostgreSQL and SQLite."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

import pytest

import conveyor
from tests.cli_harness import ROOT, Cli
from tests.conftest import CLI_ON_REDIS

APP = "tests.apps.cli_app:app"
TASK_KEYS = {"id", "name", "queue", "state", "priority", "run_at", "result", "attempts"}
ATTEMPT_KEYS = {
    "number",
    "worker_id",
    "outcome",
    "error_type",
    "error_message",
    "started_at",
    "finished_at",
}


def test_migrate_twice_is_idempotent(cli: Cli) -> None:
    cli.ok("migrate")
    assert cli.ok("migrate").strip() == "schema is up to date"


def test_first_migrate_reports_what_it_applied(bare_cli: Cli) -> None:
    cli = bare_cli
    kind = "postgres" if cli.env["CONVEYOR_URL"].startswith("postgresql") else "sqlite"
    shipped = Path(conveyor.__file__).parent / "backends" / kind / "migrations"
    count = len(list(shipped.glob("*.sql")))
    assert count >= 3
    assert cli.ok("migrate").strip() == f"applied {count} migration(s)"


@CLI_ON_REDIS
def test_enqueue_prints_the_id_and_show_returns_the_documented_shape(cli: Cli) -> None:
    first = cli.enqueue("send_mail", {"to": "ada@example.com", "n": 3})
    second = cli.enqueue("send_mail", {}, "--queue", "mail", "--priority", "7")
    assert second > first

    task = cli.show(first)
    assert set(task) >= TASK_KEYS
    assert task["id"] == first
    assert task["name"] == "send_mail"
    assert task["queue"] == "default"
    assert task["state"] == "pending"
    assert task["priority"] == 0
    assert task["run_at"] is not None
    assert task["result"] is None
    assert task["attempts"] == []
    assert task["payload"] == {"to": "ada@example.com", "n": 3}

    other = cli.show(second)
    assert (other["queue"], other["priority"]) == ("mail", 7)

    plain = cli.ok("enqueue", "send_mail")
    assert int(plain.strip()) == second + 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ("{not json", "--args is not JSON"),
        ("[1, 2]", "--args must be a JSON object"),
        ('"text"', "--args must be a JSON object"),
        ("null", "--args must be a JSON object"),
    ],
)
def test_enqueue_rejects_bad_args_with_one_line(cli: Cli, args: str, message: str) -> None:
    line = cli.fails("enqueue", "send_mail", "--args", args, "--json")
    assert message in line


def test_enqueue_checks_names_against_an_app(cli: Cli) -> None:
    assert "no task named 'nope'" in cli.fails("enqueue", "nope", "--app", APP)
    assert "does not fit" in cli.fails("enqueue", "add", "--args", '{"a": 1}', "--app", APP)
    task_id = cli.enqueue("add", {"a": 1, "b": 2}, "--app", APP)
    assert cli.show(task_id)["payload"] == {"a": 1, "b": 2}


@CLI_ON_REDIS
def test_tasks_filters_by_state_and_limit(cli: Cli) -> None:
    ids = [cli.enqueue("job", {"i": i}) for i in range(4)]
    cli.ok("cancel", str(ids[1]))

    pending = cli.json("tasks", "--state", "pending")
    assert [t["id"] for t in pending] == [ids[3], ids[2], ids[0]]
    assert all(t["state"] == "pending" for t in pending)
    assert all(TASK_KEYS - {"attempts"} <= set(t) for t in pending)

    limited = cli.json("tasks", "--state", "pending", "--limit", "2")
    assert [t["id"] for t in limited] == [ids[3], ids[2]]

    cancelled = cli.json("tasks", "--state", "cancelled", "--limit", "5")
    assert [(t["id"], t["state"]) for t in cancelled] == [(ids[1], "cancelled")]

    assert [t["id"] for t in cli.json("tasks")] == ids[::-1]
    assert cli.json("tasks", "--state", "succeeded") == []
    error = cli.usage_error("tasks", "--state", "nonsense")
    assert "'nonsense' is not one of 'pending', 'in_progress', 'waiting'" in error

    page = cli.json("tasks", "--limit", "2", "--before", str(ids[2]))
    assert [t["id"] for t in page] == [ids[1], ids[0]]


@CLI_ON_REDIS
def test_counts_by_state_queue_and_name(cli: Cli) -> None:
    ids = [cli.enqueue("job") for _ in range(3)]
    cli.enqueue("job", {}, "--queue", "mail")
    cli.ok("cancel", str(ids[0]))
    assert cli.json("counts") == [
        {"state": "cancelled", "queue": "default", "name": "job", "count": 1},
        {"state": "pending", "queue": "default", "name": "job", "count": 2},
        {"state": "pending", "queue": "mail", "name": "job", "count": 1},
    ]
    assert "pending" in cli.ok("counts")


def test_enqueue_takes_every_option_of_one_call(cli: Cli) -> None:
    at = "2031-05-06T07:08:09+00:00"
    task_id = cli.enqueue(
        "job", {}, "--run-at", at, "--timeout", "5", "--lease", "30", "--max-attempts", "4"
    )
    task = cli.show(task_id)
    assert task["run_at"].startswith("2031-05-06T07:08:09")
    assert (task["timeout"], task["lease"], task["max_attempts"]) == (5, 30, 4)
    assert "not both" in cli.fails("enqueue", "job", "--delay", "1", "--run-at", at)
    assert "lease" in cli.fails("enqueue", "job", "--lease", "0.01")
    assert "ISO 8601" in cli.fails("enqueue", "job", "--run-at", "tomorrow")


def test_cancel_twice_then_retry(cli: Cli) -> None:
    task_id = cli.enqueue("job")
    assert cli.ok("cancel", str(task_id)).strip() == f"task {task_id}: cancelled"
    assert cli.show(task_id)["state"] == "cancelled"

    line = cli.fails("cancel", str(task_id))
    assert f"task {task_id}" in line
    assert "cancelled" in line

    assert cli.ok("retry", str(task_id)).strip() == f"task {task_id}: pending"
    assert cli.show(task_id)["state"] == "pending"

    line = cli.fails("retry", str(task_id))
    assert "pending" in line


def test_unknown_ids_fail(cli: Cli) -> None:
    cli.ok("migrate")
    assert "999999" in cli.fails("show", "999999")
    assert "999999" in cli.fails("show", "999999", "--json")
    assert "999999" in cli.fails("cancel", "999999")
    assert "999999" in cli.fails("retry", "999999")


@CLI_ON_REDIS
def test_burst_worker_runs_tasks_to_completion(cli: Cli) -> None:
    good = cli.enqueue("add", {"a": 2, "b": 3})
    bad = cli.enqueue("explode", {"message": "boom"}, "--max-attempts", "1")
    cli.ok("worker", APP, "--burst", "--poll-interval", "0.1", timeout=30)

    task = cli.show(good)
    assert task["state"] == "succeeded"
    assert task["result"] == 5
    [attempt] = task["attempts"]
    assert set(attempt) >= ATTEMPT_KEYS
    assert attempt["number"] == 1
    assert attempt["outcome"] == "succeeded"
    assert attempt["worker_id"]
    assert attempt["error_type"] is None
    assert attempt["error_message"] is None
    assert attempt["started_at"] is not None
    assert attempt["finished_at"] >= attempt["started_at"]

    task = cli.show(bad)
    assert task["state"] == "failed"
    assert task["result"] is None
    [attempt] = task["attempts"]
    assert set(attempt) >= ATTEMPT_KEYS
    assert attempt["outcome"] == "failed"
    assert attempt["error_type"] == "ValueError"
    assert attempt["error_message"] == "boom"
    assert attempt["finished_at"] is not None
    assert "Traceback (most recent call last)" in attempt["traceback"]
    assert "in explode" in attempt["traceback"]
    assert "ValueError: boom" in attempt["traceback"]

    assert [t["id"] for t in cli.json("tasks", "--state", "succeeded")] == [good]
    assert [t["id"] for t in cli.json("tasks", "--state", "failed")] == [bad]

    text = cli.ok("show", str(bad))
    assert "failed" in text
    assert "ValueError: boom" in text


def test_worker_logs_json_lines_with_task_fields(cli: Cli) -> None:
    task_id = cli.enqueue("explode", {"message": "logged"}, "--max-attempts", "1")
    done = cli.run(
        "worker",
        "tests.apps.cli_app:app",
        "--burst",
        "--poll-interval",
        "0.05",
        "--log-format",
        "json",
        "--log-level",
        "DEBUG",
    )
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stderr.splitlines() if line.strip()]
    assert records, "the worker logged nothing"
    assert all({"time", "level", "logger", "message"} <= r.keys() for r in records)
    assert any(r["message"].startswith("worker ") and r["level"] == "INFO" for r in records)
    failed = [r for r in records if r.get("task_id") == task_id]
    assert failed, "no record names the failing task"
    assert failed[-1]["attempt"] == 1
    assert failed[-1]["task_name"] == "explode"
    assert failed[-1]["duration"] >= 0
    # A final failure is an ERROR that carries its traceback.
    assert failed[-1]["level"] == "ERROR"
    assert "ValueError: logged" in failed[-1]["message"]
    assert "Traceback (most recent call last)" in failed[-1]["message"]
    # ISO 8601 times, in UTC.
    assert all(datetime.fromisoformat(r["time"]).utcoffset() == timedelta(0) for r in records)


def test_worker_refuses_a_heartbeat_slower_than_its_lease(cli: Cli) -> None:
    error = cli.fails(
        "worker", "tests.apps.cli_app:app", "--burst", "--lease", "1", "--heartbeat-interval", "2"
    )
    assert "heartbeat_interval" in error


@CLI_ON_REDIS
def test_show_lists_a_workflow_s_steps(cli: Cli) -> None:
    from tests.apps.cli_app import Hello, greeting

    client = conveyor.App(cli.env["CONVEYOR_URL"], schema=cli.env["CONVEYOR_SCHEMA"])
    try:
        [handle] = client.enqueue_new([greeting.new_workflow(Hello("ada"))])
    finally:
        client.close()
    cli.ok("worker", APP, "--burst", "--poll-interval", "0.1", timeout=30)

    task = cli.show(handle.id)
    assert (task["state"], task["step"], task["result"]) == ("succeeded", "Goodbye", "bye ada")
    assert [(a["step"], a["outcome"]) for a in task["attempts"]] == [
        ("Hello", "succeeded"),
        ("Goodbye", "succeeded"),
    ]
    text = cli.ok("show", str(handle.id))
    assert "step: Goodbye" in text
    assert "Hello" in text


@CLI_ON_REDIS
def test_send_wakes_a_waiting_coroutine(cli: Cli) -> None:
    from tests.apps.cli_app import echo

    client = conveyor.App(cli.env["CONVEYOR_URL"], schema=cli.env["CONVEYOR_SCHEMA"])
    try:
        [handle] = client.enqueue_new([echo.new_coroutine({"want": 2})])
    finally:
        client.close()
    cli.ok("worker", APP, "--burst", "--poll-interval", "0.1", timeout=30)
    waiting = cli.show(handle.id)
    assert (waiting["state"], waiting["messages"]) == ("waiting", [])

    assert cli.ok("send", str(handle.id), '{"n": 1}').startswith("message ")
    sent = cli.json("send", str(handle.id), "2")  # --json: the output is JSON, like elsewhere
    assert sent["task_id"] == handle.id and isinstance(sent["id"], int)
    unread = cli.show(handle.id)["messages"]
    assert [(m["kind"], m["sender_id"], m["body"]) for m in unread] == [
        ("message", None, {"n": 1}),
        ("message", None, 2),
    ]
    text = cli.ok("show", str(handle.id))
    assert "inbox: 2 unread message(s)" in text
    cli.ok("worker", APP, "--burst", "--poll-interval", "0.1", timeout=30)
    task = cli.show(handle.id)
    assert (task["state"], task["result"], task["inbox"]) == ("succeeded", [{"n": 1}, 2], True)

    assert "has finished" in cli.fails("send", str(handle.id), "3")
    assert "MESSAGE is not JSON" in cli.fails("send", str(handle.id), "{nope")
    assert "no task with id" in cli.fails("send", "999999", "--json", "1")


def test_enqueue_and_send_with_an_idempotency_key_can_be_repeated(cli: Cli) -> None:
    from tests.apps.cli_app import echo

    first = cli.enqueue("add", {"a": 1, "b": 2}, "--idempotency-key", "order-1")
    assert cli.enqueue("add", {"a": 1, "b": 2}, "--idempotency-key", "order-1") == first
    assert cli.enqueue("add", {"a": 1, "b": 2}, "--idempotency-key", "order-2") != first
    assert cli.show(first)["idempotency_key"] == "order-1"

    client = conveyor.App(cli.env["CONVEYOR_URL"], schema=cli.env["CONVEYOR_SCHEMA"])
    try:
        [handle] = client.enqueue_new([echo.new_coroutine({"want": 9})])
    finally:
        client.close()
    sent = cli.ok("send", str(handle.id), "--json", "1", "--idempotency-key", "hook-1")
    assert cli.ok("send", str(handle.id), "--json", "1", "--idempotency-key", "hook-1") == sent
    assert len(cli.show(handle.id)["messages"]) == 1


def test_worker_takes_the_store_from_url_and_schema(cli: Cli, tmp_path: Path) -> None:
    """``--url``/``--schema`` point the worker at a store other than the
    app's (the app here reads CONVEYOR_URL, which points elsewhere)."""
    task_id = cli.enqueue("add", {"a": 20, "b": 22})
    elsewhere = {**cli.env, "CONVEYOR_URL": f"sqlite:///{tmp_path / 'elsewhere.db'}"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "conveyor.cli",
            "worker",
            APP,
            "--burst",
            "--poll-interval",
            "0.1",
            "--url",
            cli.env["CONVEYOR_URL"],
            "--schema",
            cli.env["CONVEYOR_SCHEMA"],
        ],
        cwd=ROOT,
        env=elsewhere,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert cli.show(task_id)["result"] == 42
