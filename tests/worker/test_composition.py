"""Groups, chords, chains and dependencies with real workers, on every
backend: a chord's callback runs once, after every member, with their
outcomes in order (failures included); a chain hands each link the result
of the one before and stops at a failed link; ``after`` holds a task back
until its dependencies succeeded, and its policy decides what a failed one
does; a group's handle awaits, cancels and retries its members; bad
compositions are refused before any I/O."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

import conveyor
from conveyor import Fatal, TaskState, chain, chord, group, on_failure, on_success
from conveyor.errors import ConfigurationError, PayloadError, TaskFailedError
from tests.cli_harness import Cli
from tests.worker.helpers import RunningWorker, wait_terminal


@pytest.fixture
def app(any_app: conveyor.App) -> conveyor.App:
    return any_app


def register(app: conveyor.App) -> dict[str, Any]:
    calls: list[Any] = []

    @app.task()
    async def square(n: int) -> int:
        if n < 0:
            raise Fatal(f"negative: {n}")
        return n * n

    @app.task()
    async def total(outcomes: list[dict[str, Any]], label: str = "") -> dict[str, Any]:
        calls.append(outcomes)
        return {
            "label": label,
            "sum": sum(o["result"] for o in outcomes if o["state"] == "succeeded"),
            "failed": [o["task_id"] for o in outcomes if o["state"] != "succeeded"],
        }

    @app.task()
    async def add(value: int, more: int) -> int:
        return value + more

    return {"square": square, "total": total, "add": add, "calls": calls}


async def test_a_chord_s_callback_runs_once_with_every_outcome_in_order(
    app: conveyor.App,
) -> None:
    t = register(app)
    async with app:
        handle = await chord(
            [t["square"].s(n=n) for n in (1, 2, -3, 4)],
            t["total"].s(label="x").receiving("outcomes"),
        ).enqueue_async()
        callback = await handle.callback.get_async()
        assert (callback.state, callback.waiting_for) == (TaskState.WAITING, 4)
        async with RunningWorker(app, concurrency=4):
            result = await handle.result_async(timeout=20)
    failed = handle.group.ids[2]
    assert result == {"label": "x", "sum": 1 + 4 + 16, "failed": [failed]}
    [outcomes] = t["calls"]
    assert [o["task_id"] for o in outcomes] == handle.group.ids
    assert [o["state"] for o in outcomes] == ["succeeded", "succeeded", "failed", "succeeded"]
    assert outcomes[2]["error_type"] == "conveyor.errors.Fatal"
    assert "negative: -3" in outcomes[2]["error_message"]


async def test_a_chain_hands_each_link_the_result_before_it(app: conveyor.App) -> None:
    t = register(app)
    async with app:
        handle = await chain(
            t["square"].s(n=3),
            t["add"].s(more=1).receiving("value"),
            t["add"].s(more=10).receiving("value"),
        ).enqueue_async()
        async with RunningWorker(app, concurrency=2):
            assert await handle.result_async(timeout=20) == 20
        broken = await chain(
            t["square"].s(n=-1), t["add"].s(more=1).receiving("value")
        ).enqueue_async()
        async with RunningWorker(app, concurrency=2):
            tasks = await wait_terminal(app, [h.id for h in broken.links])
    assert [task.state for task in tasks] == [TaskState.FAILED, TaskState.CANCELLED]
    with pytest.raises(TaskFailedError):
        await broken.result_async(timeout=1)


async def test_after_holds_a_task_back_by_its_policy(app: conveyor.App) -> None:
    t = register(app)
    async with app:
        ok = await t["square"].enqueue_async(n=2)
        bad = await t["square"].enqueue_async(n=-2)
        waits = await t["add"].options(after=[ok]).enqueue_async(value=1, more=1)
        cancelled = await t["add"].options(after=[ok, bad]).enqueue_async(value=1, more=1)
        failed = await (
            t["add"].options(after=[bad.id], on_dependency_failure="fail").enqueue_async(1, 1)
        )
        runs = await t["add"].options(after=[bad], on_dependency_failure="run").enqueue_async(2, 2)
        async with RunningWorker(app, concurrency=4):
            tasks = await wait_terminal(app, [waits.id, cancelled.id, failed.id, runs.id])
    assert [task.state for task in tasks] == [
        TaskState.SUCCEEDED,
        TaskState.CANCELLED,
        TaskState.FAILED,
        TaskState.SUCCEEDED,
    ]
    assert [d.task_id for d in await app.dependencies_async(cancelled.id)] == [ok.id, bad.id]


async def test_a_group_s_handle_awaits_cancels_and_retries_its_members(
    app: conveyor.App,
) -> None:
    t = register(app)
    async with app:
        members = await group(t["square"].s(n=n) for n in (1, 2, 3)).enqueue_async()
        async with RunningWorker(app, concurrency=3):
            assert await members.results_async(timeout=20) == [1, 4, 9]
        later = await group(
            t["square"].s(n=5).options(delay=3600), t["square"].s(n=-1)
        ).enqueue_async()
        async with RunningWorker(app, concurrency=2):
            await wait_terminal(app, [later.ids[1]])
        outcomes = await asyncio.wait_for(later.members[1].get_async(), 5)
        assert outcomes.state is TaskState.FAILED
        assert await later.cancel_async() == [later.ids[0]]
        assert sorted(await later.retry_failed_async()) == later.ids
        assert [(await m.get_async()).state for m in later.members] == [TaskState.PENDING] * 2


async def test_callbacks_on_success_and_on_failure(app: conveyor.App) -> None:
    t = register(app)
    async with app:
        good = await t["square"].enqueue_async(n=3)
        bad = await t["square"].enqueue_async(n=-3)
        then = t["add"].s(more=1).receiving("value")
        alert = t["total"].s(label="alert").receiving("outcomes")
        ran_after_good = await on_success(good, then).enqueue_async()
        cancelled_after_bad = await on_success(bad, then).enqueue_async()
        alerted = await on_failure(bad, alert).enqueue_async()
        not_needed = await on_failure(good, alert).enqueue_async()
        ids = [ran_after_good.id, cancelled_after_bad.id, alerted.id, not_needed.id]
        async with RunningWorker(app, concurrency=4):
            tasks = await wait_terminal(app, ids)
    assert [task.state for task in tasks] == [
        TaskState.SUCCEEDED,
        TaskState.CANCELLED,
        TaskState.SUCCEEDED,
        TaskState.CANCELLED,
    ]
    assert tasks[0].result == 10
    assert tasks[2].result == {"label": "alert", "sum": 0, "failed": [bad.id]}
    [skipped] = tasks[3].attempts
    assert (skipped.outcome.value, skipped.error_type) == ("cancelled", "NotNeeded")
    assert [o[0]["task_id"] for o in t["calls"]] == [bad.id]  # the handler ran once


def test_bad_compositions_are_refused_before_any_io(app: conveyor.App) -> None:
    t = register(app)
    with pytest.raises(ConfigurationError, match="at least one"):
        chain()
    with pytest.raises(ConfigurationError, match="no parameter"):
        t["add"].s(more=1).receiving("nothing")
    with pytest.raises(PayloadError, match="receives 'value'"):
        chain(t["square"].s(n=1), t["add"].s(value=1, more=1).receiving("value")).new_tasks()
    with pytest.raises(PayloadError, match="missing a required argument: more"):
        t["add"].s(value=1).new_task()
    with pytest.raises(ConfigurationError, match="signatures"):
        group([t["square"].s(n=1), 5])  # type: ignore[list-item]
    with pytest.raises(ConfigurationError, match="on_dependency_failure"):
        t["add"].options(on_dependency_failure="ignore")  # type: ignore[typeddict-item]
    other = conveyor.App("memory://other")

    @other.task(name="square")
    async def elsewhere(n: int) -> int:
        return n

    with pytest.raises(ConfigurationError, match="one app"):
        group(t["square"].s(n=1), elsewhere.s(n=2)).new_tasks()


async def test_the_command_line_enqueues_a_dependent_and_shows_its_dependencies(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    app = conveyor.App(url)

    @app.task()
    async def job() -> None:
        return None

    app.migrate()
    cli = Cli(url, "")
    first = int(json.loads(cli.ok("enqueue", "job", "--delay", "3600", "--json"))["id"])
    second = int(json.loads(cli.ok("enqueue", "job", "--json"))["id"])
    waits = int(
        json.loads(cli.ok("enqueue", "job", "--after", f"{first},{second}", "--json"))["id"]
    )
    shown = json.loads(cli.ok("show", str(waits), "--json"))
    assert (shown["state"], shown["waiting_for"]) == ("waiting", 2)
    assert [(d["id"], d["state"]) for d in shown["dependencies"]] == [
        (first, "pending"),
        (second, "pending"),
    ]
    text = cli.ok("show", str(waits))
    assert "dependencies: 2, 2 not ended" in text
    assert "dependencies" in cli.ok("explain", str(waits))
    assert "--after" in cli.fails("enqueue", "job", "--after", "1,x")
    assert "no task with id" in cli.fails("enqueue", "job", "--after", "999999")
    policy = cli.fails("enqueue", "job", "--after", str(first), "--on-dependency-failure", "x")
    assert "on_dependency_failure" in policy
    app.close()
