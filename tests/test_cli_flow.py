"""``conveyor pause``, ``resume`` and ``pauses`` as an operator runs them, on
PostgreSQL and SQLite: the pause is stored and what a claim then takes."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime
from zoneinfo import ZoneInfo

import conveyor
from conveyor.backends.params import ClaimParams
from conveyor.worker.scheduler import Scheduler
from tests.cli_harness import Cli
from tests.conftest import CLI_ON_REDIS


def claimable(cli: Cli, queue: str, name: str) -> int:
    """How many due tasks a worker serving ``name`` on ``queue`` would claim."""
    app = conveyor.App(cli.env["CONVEYOR_URL"], schema=cli.env["CONVEYOR_SCHEMA"])

    async def count() -> int:
        backend = await app.backend()
        claimed = await backend.claim(
            ClaimParams(worker_id="probe", names=[name], queues=[queue], limit=10, lease=30)
        )
        return len(claimed)

    try:
        return asyncio.run(count())
    finally:
        app.close()


@CLI_ON_REDIS
def test_pause_and_resume_a_queue_from_the_command_line(cli: Cli) -> None:
    cli.enqueue("report", {}, "--queue", "mail")
    assert cli.ok("pause", "--queue", "mail").strip() == "queue mail: paused"
    assert cli.ok("pause", "--queue", "mail").strip() == "queue mail: was paused already"
    [listed] = cli.json("pauses")
    assert (listed["kind"], listed["name"]) == ("queue", "mail")
    assert "mail" in cli.ok("pauses")
    assert claimable(cli, "mail", "report") == 0
    assert cli.ok("resume", "--queue", "mail").strip() == "queue mail: resumed"
    assert cli.ok("resume", "--queue", "mail").strip() == "queue mail: was not paused"
    assert cli.json("pauses") == []
    assert claimable(cli, "mail", "report") == 1


def test_pause_a_task_name(cli: Cli) -> None:
    cli.enqueue("report", {})
    cli.enqueue("other", {})
    cli.ok("pause", "--task", "report")
    assert claimable(cli, "default", "report") == 0
    assert claimable(cli, "default", "other") == 1
    assert cli.ok("pauses", "--json").count('"task"') == 1


def test_pause_wants_one_target(cli: Cli) -> None:
    assert "one --queue or one --task" in cli.fails("pause")
    assert "one --queue or one --task" in cli.fails("resume", "--queue", "a", "--task", "b")


@CLI_ON_REDIS
def test_prune_counts_then_deletes_finished_tasks(cli: Cli) -> None:
    task_id = cli.enqueue("report", {})
    cli.ok("cancel", str(task_id))
    pending = cli.enqueue("report", {})
    # Nothing is old enough under the defaults.
    assert cli.ok("prune", "--dry-run").strip() == "would prune 0 task(s) and 0 worker(s)"
    assert "takes an age" in cli.fails("prune", "--cancelled", "soon")
    counted = cli.json("prune", "--cancelled", "1h", "--dry-run")
    assert counted == {"tasks": 0, "workers": 0, "dry_run": True}  # not an hour old
    time.sleep(1.2)
    assert cli.json("prune", "--cancelled", "1s", "--dry-run")["tasks"] == 1
    assert cli.ok("prune", "--cancelled", "1s").strip() == "pruned 1 task(s) and 0 worker(s)"
    assert "no task" in cli.fails("show", str(task_id))
    assert str(pending) in cli.ok("show", str(pending))


@CLI_ON_REDIS
def test_schedules_lists_each_with_its_next_and_last_slot(cli: Cli) -> None:
    assert "no schedules" in cli.ok("schedules")
    app = conveyor.App(cli.env["CONVEYOR_URL"], schema=cli.env["CONVEYOR_SCHEMA"])

    @app.task()
    async def report() -> None:
        return None

    app.schedule(report, cron="30 2 * * *", tz="Europe/Paris", name="nightly")
    app.schedule(report, every=1, name="often")

    async def sync_and_fire() -> None:
        scheduler = Scheduler(await app.backend(), app.schedules, app.tasks, 1 << 20)
        await scheduler.sync()
        await asyncio.sleep(1.1)
        await scheduler.run_once()
        await app.aclose()

    try:
        asyncio.run(sync_and_fire())
    finally:
        app.close()
    nightly, often = cli.json("schedules")
    assert (nightly["name"], nightly["cron"], nightly["tz"]) == (
        "nightly",
        "30 2 * * *",
        "Europe/Paris",
    )
    upcoming = datetime.fromisoformat(nightly["next_slot"])
    assert upcoming.astimezone(ZoneInfo("Europe/Paris")).strftime("%H:%M") == "02:30"
    assert nightly["last_task_id"] is None
    assert (often["every"], often["last_task_state"]) == (1.0, "pending")
    assert often["last_task_id"] is not None
    shown = cli.ok("schedules")
    assert "nightly" in shown and "30 2 * * * (Europe/Paris)" in shown and "every 1s" in shown


def test_run_now_and_delete(cli: Cli) -> None:
    later = cli.enqueue("report", {}, "--delay", "3600")
    assert claimable(cli, "default", "report") == 0
    assert cli.ok("run-now", str(later)).strip() == f"task {later}: due now"
    assert claimable(cli, "default", "report") == 1
    assert "cannot run now" in cli.fails("run-now", str(later))  # claimed: not pending
    other = cli.enqueue("report", {})
    assert "cancel it first" in cli.fails("delete", str(later), "--yes")
    assert cli.ok("delete", str(other), "--yes").strip() == f"task {other}: deleted"
    assert "no task" in cli.fails("show", str(other))


def test_the_worker_takes_no_prune_and_no_schedules(cli: Cli) -> None:
    help_text = cli.ok("worker", "--help")
    assert "--no-prune" in help_text and "--no-schedules" in help_text
    done = cli.run(
        "worker", "tests.apps.cli_app:app", "--burst", "--no-prune", "--no-schedules", timeout=60
    )
    assert done.returncode == 0, done.stderr


@CLI_ON_REDIS
def test_keys_shows_what_holds_keyed_tasks(cli: Cli) -> None:
    assert "no flow-control key" in cli.ok("keys")
    app = conveyor.App(cli.env["CONVEYOR_URL"], schema=cli.env["CONVEYOR_SCHEMA"])

    @app.task(concurrency=conveyor.Concurrency(key="user:7", limit=2))
    def sync_user() -> None:
        return None

    try:
        for _ in range(3):
            sync_user.enqueue()
    finally:
        app.close()
    [key] = cli.json("keys")
    assert (key["key"], key["max_running"], key["running"], key["pending"]) == ("user:7", 2, 0, 3)
    assert "user:7" in cli.ok("keys")
