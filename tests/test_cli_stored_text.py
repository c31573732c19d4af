"""Stored text printed as text: every command that prints what a store holds
(task names and queues, payloads, results, error messages and tracebacks,
worker ids and hosts, schedule, pause and key names, inbox messages) prints
rich markup, emoji codes and control characters as they are written, never
as markup, emoji or terminal sequences; run for real in subprocesses on
PostgreSQL, SQLite and Redis, as if to a terminal (``FORCE_COLOR``), where
rich would print a ``[link=...]`` as a hyperlink."""

from __future__ import annotations

import json
import re
import sqlite3
from dataclasses import dataclass

import psycopg
import pytest

import conveyor
from conveyor.backends.params import (
    ClaimParams,
    Completion,
    Delivery,
    EnqueueParams,
    ErrorInfo,
    FinishParams,
    NewTask,
    ScheduleSync,
    SendParams,
)
from conveyor.model import Outcome, PauseKind, RetryPolicy, TaskState
from conveyor.records import StoredSchedule, WorkerInfo
from tests.cli_harness import Cli
from tests.conftest import CLI_ON_REDIS

MARKUP = "[/x] [link=http://evil]x[/link] [bold red]x :smile:"
"""Printable: a name the name rule takes."""
CONTROLS = "\x1b[2J \x1b]0;title\x07 \x1b]52;c;ZXZpbA==\x07 \x9b31m \x07 \x7f \u202e \u2066 \x01 \r"
HOSTILE = f"{MARKUP} {CONTROLS}"
HOSTILE_SHOWN = (
    "[/x] [link=http://evil]x[/link] [bold red]x :smile: "
    "\\x1b[2J \\x1b]0;title\\x07 \\x1b]52;c;ZXZpbA==\\x07 \\x9b31m \\x07 \\x7f "
    "\\u202e \\u2066 \\x01 \\r"
)
STYLE = re.compile("\x1b\\[[0-9;]*m")
"""Our own styling, which a terminal gets: SGR sequences only."""
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")


@dataclass
class Seeded:
    failed: int
    succeeded: int
    running: int
    inbox: int
    keyed: int
    sql: bool
    """Whether text the name rule refuses (control characters in names,
    queues and pauses) was written straight into the store too."""


def new_task(name: str, queue: str, payload: object, **more: object) -> NewTask:
    return NewTask(
        name=name,
        queue=queue,
        payload=json.dumps(payload),
        priority=0,
        max_attempts=1,
        retry=RetryPolicy(max_attempts=1),
        **more,  # type: ignore[arg-type]
    )


def seed(cli: Cli) -> Seeded:
    """Tasks, attempts, a worker, a schedule, pauses, a key and a message
    holding hostile text, written as the API and a worker write them; on a
    SQL store, control characters also in a task's name and queue and in a
    pause's name, written by hand (the name rule keeps them out)."""
    url, schema = cli.env["CONVEYOR_URL"], cli.env["CONVEYOR_SCHEMA"]
    client = conveyor.App(url, schema=schema)

    async def write() -> list[int]:
        backend = await client.backend()
        worker = WorkerInfo(HOSTILE, HOSTILE, 1, (MARKUP,), 4, tasks=(MARKUP,), beat_seconds=600.0)
        await backend.register_worker(worker)
        claim = ClaimParams(worker_id=HOSTILE, names=[MARKUP], queues=[MARKUP], limit=1, lease=600)
        ids = []
        for outcome in (Outcome.FAILED, Outcome.SUCCEEDED, None):
            [task_id] = await backend.enqueue(
                EnqueueParams([new_task(MARKUP, MARKUP, {"text": HOSTILE})])
            )
            [claimed] = await backend.claim(claim)
            ids.append(task_id)
            if outcome is Outcome.FAILED:
                error = ErrorInfo(
                    HOSTILE, HOSTILE, f"Traceback (most recent call last):\n  {HOSTILE}\n"
                )
                done = Completion(claimed.token, outcome, TaskState.FAILED, error=error)
            elif outcome is Outcome.SUCCEEDED:
                result = json.dumps(HOSTILE)
                done = Completion(claimed.token, outcome, TaskState.SUCCEEDED, result=result)
            else:
                continue  # left running, under HOSTILE's lease
            await backend.finish(FinishParams(HOSTILE, [done]))
        [inbox] = await backend.enqueue(
            EnqueueParams([new_task("inbox", "inbox", {"text": HOSTILE}, inbox=True)])
        )
        await backend.send(SendParams([Delivery(inbox, json.dumps({"text": HOSTILE}))]))
        [keyed] = await backend.enqueue(
            EnqueueParams(
                [new_task("keyed", "keyed", {}, concurrency_key=HOSTILE, concurrency_limit=1)]
            )
        )
        schedule = StoredSchedule(
            HOSTILE, HOSTILE, None, 60.0, "UTC", "latest", 10, "{}", "fingerprint"
        )
        await backend.sync_schedules(ScheduleSync([schedule], [HOSTILE]))
        await backend.pause(PauseKind.QUEUE, MARKUP)
        await backend.pause(PauseKind.TASK, "by-hand")
        return [*ids, inbox, keyed]

    try:
        failed, succeeded, running, inbox, keyed = client.portal.run(write())
    finally:
        client.close()
    sql = not url.startswith("redis")
    if sql:
        by_hand(url, schema, inbox)
    return Seeded(failed, succeeded, running, inbox, keyed, sql)


def by_hand(url: str, schema: str, task_id: int) -> None:
    """Control characters in a task's name and queue and in a pause's name,
    written straight into a SQL store."""
    if url.startswith("sqlite"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as db:
            db.execute(
                "update conveyor_tasks set name = ?, queue = ? where id = ?",
                (HOSTILE, HOSTILE, task_id),
            )
            db.execute("update conveyor_pauses set name = ? where name = 'by-hand'", (HOSTILE,))
        return
    with psycopg.connect(url, autocommit=True) as db:
        db.execute(f'set search_path to "{schema}"')
        db.execute(
            "update tasks set name = %s, queue = %s where id = %s", (HOSTILE, HOSTILE, task_id)
        )
        db.execute("update pauses set name = %s where name = 'by-hand'", (HOSTILE,))


def printed(cli: Cli, *args: str) -> str:
    """What a command printed, as to a terminal: it exits 0, and neither its
    output nor its errors carry a terminal sequence other than our styling,
    a control character, an emoji made of a code, or a hyperlink."""
    done = cli.run(*args)
    assert done.returncode == 0, f"{args} exited {done.returncode}: {done.stderr}"
    for text in (done.stdout, done.stderr):
        bare = STYLE.sub("", text)
        assert not RAW.search(bare), f"{args} printed {RAW.search(bare)!r} raw: {text!r}"
        assert "\x1b]" not in text  # no OSC: no hyperlink, title or clipboard
        assert "\U0001f604" not in text  # :smile: stays a code
    return STYLE.sub("", done.stdout)


@pytest.fixture
def made(cli: Cli) -> Seeded:
    """The store seeded with hostile text, and the commands run as if to a
    terminal that takes colours and hyperlinks."""
    cli.env.update(FORCE_COLOR="1", TERM="xterm-256color", COLORTERM="truecolor")
    cli.env.pop("NO_COLOR", None)
    return seed(cli)


@CLI_ON_REDIS
def test_task_listings_print_names_and_queues_as_text(cli: Cli, made: Seeded) -> None:
    for options in ((), ("--state", "in_progress"), ("--name", MARKUP), ("--queue", MARKUP)):
        assert MARKUP in printed(cli, "tasks", *options)
    assert MARKUP in printed(cli, "tasks", "--before", str(made.inbox))
    for listing in (printed(cli, "tasks", "--limit", "3"), printed(cli, "counts")):
        assert MARKUP in listing
        assert (HOSTILE_SHOWN in listing) == made.sql


@CLI_ON_REDIS
def test_show_and_explain_print_errors_results_and_messages_as_text(cli: Cli, made: Seeded) -> None:
    failed = printed(cli, "show", str(made.failed))
    assert f"{HOSTILE_SHOWN}: {HOSTILE_SHOWN}" in failed  # the error, in the attempts table
    assert f"\n  {HOSTILE_SHOWN}\n" in failed  # the traceback, as a block of lines
    assert "[link=http://evil]" in printed(cli, "show", str(made.succeeded))
    assert f"running on {HOSTILE_SHOWN}" in printed(cli, "show", str(made.running))
    inbox = printed(cli, "show", str(made.inbox))
    assert "1 unread message(s)" in inbox
    assert "\\u001b]52;c;ZXZpbA==" in inbox  # JSON's escape, shown as it is
    assert (HOSTILE_SHOWN in inbox) == made.sql
    for task_id in (made.failed, made.succeeded, made.inbox, made.keyed):
        printed(cli, "explain", str(task_id))
    assert HOSTILE_SHOWN in printed(cli, "explain", str(made.running))


@CLI_ON_REDIS
def test_workers_health_and_top_print_worker_ids_and_hosts_as_text(cli: Cli, made: Seeded) -> None:
    for options in ((), ("--all",)):
        assert f"{HOSTILE_SHOWN} │ {HOSTILE_SHOWN}" in printed(cli, "workers", *options)
    assert f"{HOSTILE_SHOWN} on {HOSTILE_SHOWN}: queues {MARKUP}" in printed(cli, "health")
    frame = printed(cli, "top", "--once")
    assert HOSTILE_SHOWN in frame and MARKUP in frame


@CLI_ON_REDIS
def test_flow_listings_and_actions_print_stored_text_as_text(cli: Cli, made: Seeded) -> None:
    pauses = printed(cli, "pauses")
    assert MARKUP in pauses
    assert (HOSTILE_SHOWN in pauses) == made.sql
    assert HOSTILE_SHOWN in printed(cli, "keys")
    assert f"{HOSTILE_SHOWN} │ {HOSTILE_SHOWN}" in printed(cli, "schedules")
    printed(cli, "prune", "--dry-run")
    printed(cli, "retry", "--dry-run", "--state", "failed", "--name", MARKUP)
    printed(cli, "cancel", "--dry-run", "--queue", MARKUP)
    check_json(cli, made)
    assert printed(cli, "pause", "--queue", MARKUP) == f"queue {MARKUP}: was paused already\n"
    printed(cli, "enqueue", MARKUP)  # on the default queue: a warning names it
    assert printed(cli, "retry", str(made.failed)) == f"task {made.failed}: pending\n"
    printed(cli, "cancel", str(made.inbox), str(made.keyed), str(made.succeeded))
    printed(cli, "delete", "--yes", "--state", "cancelled")


def check_json(cli: Cli, made: Seeded) -> None:
    """``--json`` of every read command: ASCII JSON, the stored text in it as
    written."""
    for command in ("tasks", "counts", "workers", "health", "pauses", "keys", "schedules"):
        assert_json(cli, command)
    for task_id in (made.failed, made.succeeded, made.running, made.inbox):
        assert_json(cli, "show", str(task_id))
        assert_json(cli, "explain", str(task_id))
    assert cli.json("show", str(made.failed))["attempts"][0]["error_message"] == HOSTILE


def assert_json(cli: Cli, *args: str) -> None:
    """``--json`` output: ASCII JSON (every control character, C1 and bidi
    one among them, escaped by JSON), holding the stored text as written."""
    text = cli.ok(*args, "--json")
    assert text.isascii()
    assert RAW.search(text.rstrip("\n")) is None
    json.loads(text)


def test_a_worker_logs_a_hostile_error_as_text(cli: Cli) -> None:
    cli.enqueue("explode", {"message": HOSTILE}, "--max-attempts", "1")
    done = cli.run("worker", "tests.apps.cli_app:app", "--burst", timeout=60)
    assert done.returncode == 0, done.stderr
    assert f"ValueError: {HOSTILE_SHOWN}" in done.stderr
    assert not RAW.search(done.stderr)
