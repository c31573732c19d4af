"""Expiry with real workers, on every backend: a task not started by its
expiry time ends cancelled without running, its attempt log saying why; one
started in time runs, and its retries run past the time; a task's own
default applies to each enqueue; an expiry not after the time the task is
due is refused before any I/O; ``conveyor enqueue --expires`` does the same."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import conveyor
from conveyor import Outcome, RetryPolicy, TaskState
from conveyor.errors import ConfigurationError
from tests.cli_harness import Cli
from tests.worker.helpers import RunningWorker, wait_terminal


@pytest.fixture
def app(any_app: conveyor.App) -> conveyor.App:
    return any_app


async def test_a_task_not_started_by_its_expiry_ends_cancelled_without_running(
    app: conveyor.App,
) -> None:
    ran: list[int] = []

    @app.task()
    async def job(n: int) -> int:
        ran.append(n)
        return n

    @app.task(expires=0.3)
    async def short_lived(n: int) -> int:
        ran.append(n)
        return n

    async with app:
        late = await job.options(expires=0.3).enqueue_async(n=1)
        fresh = await job.options(expires=timedelta(minutes=5)).enqueue_async(n=2)
        plain = await job.enqueue_async(n=3)
        by_default = await short_lived.enqueue_async(n=4)
        await asyncio.sleep(0.8)
        async with RunningWorker(app, concurrency=4):
            ids = [late.id, fresh.id, plain.id, by_default.id]
            tasks = await wait_terminal(app, ids)
    assert [t.state for t in tasks] == [
        TaskState.CANCELLED,
        TaskState.SUCCEEDED,
        TaskState.SUCCEEDED,
        TaskState.CANCELLED,
    ]
    assert sorted(ran) == [2, 3]
    for expired in (tasks[0], tasks[3]):
        [attempt] = expired.attempts
        assert (attempt.outcome, attempt.error_type) == (Outcome.CANCELLED, "Expired")
        assert attempt.error_message is not None
        assert attempt.error_message.startswith("not started by its expiry time")


async def test_a_task_that_started_in_time_retries_past_its_expiry(app: conveyor.App) -> None:
    tries: list[int] = []

    @app.task(retry=RetryPolicy(max_attempts=2, initial_interval=4.0, jitter=0.0))
    async def flaky() -> str:
        tries.append(1)
        if len(tries) == 1:
            raise RuntimeError("once")
        return "ok"

    async with app, RunningWorker(app):
        handle = await flaky.options(expires=3.0).enqueue_async()
        [task] = await wait_terminal(app, [handle.id], timeout=30)
    assert task.state is TaskState.SUCCEEDED and len(tries) == 2
    assert [a.outcome for a in task.attempts] == [Outcome.FAILED, Outcome.SUCCEEDED]


async def test_an_expiry_not_after_the_due_time_is_refused_before_any_io(
    app: conveyor.App,
) -> None:
    @app.task()
    async def job() -> None:
        return None

    async with app:
        for options in (
            {"expires": 0},
            {"expires": -1},
            {"expires": float("nan")},
            {"expires": "soon"},
            {"expires": datetime(2000, 1, 1, tzinfo=UTC)},
            {"expires": datetime(2100, 1, 1)},  # naive
            {"expires": 5, "delay": 10},
            {"expires": 5, "delay": 5},
            {"expires": datetime.now(UTC) + timedelta(minutes=1), "delay": 120},
            {
                "expires": datetime.now(UTC) + timedelta(minutes=1),
                "run_at": datetime.now(UTC) + timedelta(hours=1),
            },
        ):
            with pytest.raises(ConfigurationError, match="expires"):
                await job.options(**options).enqueue_async()  # type: ignore[arg-type]
        assert await app.list_tasks_async() == []


async def test_the_command_s_expires_flag_comes_from_the_option_s_declaration(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    app = conveyor.App(url)

    @app.task()
    async def job() -> None:
        return None

    app.migrate()
    cli = Cli(url, "")
    late = int(json.loads(cli.ok("enqueue", "job", "--expires", "0.3", "--json"))["id"])
    kept = int(json.loads(cli.ok("enqueue", "job", "--expires", "600", "--json"))["id"])
    assert "expires" in cli.fails("enqueue", "job", "--expires", "5", "--delay", "10")
    await asyncio.sleep(0.8)
    async with app, RunningWorker(app):
        tasks = await wait_terminal(app, [late, kept])
    app.close()
    assert [t.state for t in tasks] == [TaskState.CANCELLED, TaskState.SUCCEEDED]
