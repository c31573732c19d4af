"""A handler's say over what comes next: ``Snooze``, ``Retry`` and a retry
policy's ``retry_on`` and ``fatal``, on every backend and in every executor."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest

import conveyor
from conveyor import Outcome, RetryPolicy, TaskState
from conveyor.errors import ConfigurationError
from tests.apps import cpu
from tests.worker.helpers import RunningWorker, run_all, wait_for

FAST = RetryPolicy(max_attempts=3, initial_interval=0.01, max_interval=0.01, jitter=0)


@pytest.fixture
def app(any_app: conveyor.App) -> conveyor.App:
    return any_app


async def test_snooze_runs_again_later_without_spending_an_attempt(app: conveyor.App) -> None:
    runs: list[float] = []

    @app.task(retry=RetryPolicy(max_attempts=1))
    async def patient() -> int:
        runs.append(asyncio.get_running_loop().time())
        if len(runs) < 4:
            raise conveyor.Snooze(timedelta(milliseconds=150))
        return len(runs)

    async with app:
        [task] = await run_all(app, [await patient.enqueue_async()])
    # One attempt in the budget, four runs: the snoozes spent nothing.
    assert task.state is TaskState.SUCCEEDED and task.result == 4
    assert [a.outcome for a in task.attempts] == [Outcome.INTERRUPTED] * 3 + [Outcome.SUCCEEDED]
    assert {a.error_type for a in task.attempts[:3]} == {"conveyor.errors.Snooze"}
    assert "snoozed for 0.15s" in (task.attempts[0].error_message or "")
    gaps = [later - earlier for earlier, later in itertools.pairwise(runs)]
    assert min(gaps) >= 0.14


async def test_snooze_in_a_thread_handler(app: conveyor.App) -> None:
    @app.task(retry=RetryPolicy(max_attempts=1))
    def sleepy(ctx: conveyor.TaskContext) -> int:
        if ctx.attempt == 1:
            raise conveyor.Snooze(0)
        return ctx.attempt

    async with app:
        [task] = await run_all(app, [await sleepy.enqueue_async()])
    assert task.state is TaskState.SUCCEEDED and task.result == 2


async def test_snooze_and_retry_in_a_process_handler(app: conveyor.App, tmp_path: Path) -> None:
    snoozer = app.task(name="snooze_once", process=True, retry=RetryPolicy(max_attempts=1))(
        cpu.snooze_once
    )
    retrier = app.task(name="retry_later", process=True, retry=FAST)(cpu.retry_later)
    async with app:
        first = await snoozer.enqueue_async(marker=str(tmp_path / "marker"))
        second = await retrier.enqueue_async(delay=0.2)
        done, failed = await run_all(app, [first, second])
    assert done.state is TaskState.SUCCEEDED and done.result == "woke"
    assert [a.outcome for a in done.attempts] == [Outcome.INTERRUPTED, Outcome.SUCCEEDED]
    assert failed.state is TaskState.FAILED and len(failed.attempts) == 3
    assert failed.attempts[0].error_message == "the mail server said later"
    gaps = [
        (b.started_at - a.finished_at).total_seconds()
        for a, b in zip(failed.attempts, failed.attempts[1:], strict=False)
        if a.finished_at is not None
    ]
    assert min(gaps) >= 0.15, gaps  # the handler's delay, not the policy's 0.01 s


async def test_snooze_of_a_cancelled_task_ends_it(app: conveyor.App) -> None:
    started = threading.Event()

    @app.task()
    def dozes() -> None:
        started.set()
        time.sleep(0.3)  # the cancel lands meanwhile; the handler does not look
        raise conveyor.Snooze(60)

    async with app:
        handle = await dozes.enqueue_async()
        async with RunningWorker(app):
            await asyncio.to_thread(started.wait, 10)
            await app.cancel_async(handle.id)

            async def ended() -> bool:
                task = await app.get_async(handle.id)
                return task is not None and task.state is TaskState.CANCELLED

            await wait_for(ended)


async def test_retry_asks_for_its_own_delay(app: conveyor.App) -> None:
    runs: list[float] = []

    @app.task(retry=RetryPolicy(max_attempts=3, initial_interval=30, jitter=0))
    async def flaky() -> str:
        runs.append(asyncio.get_running_loop().time())
        if len(runs) == 1:
            raise conveyor.Retry(delay=0.1)
        return "ok"

    async with app:
        [task] = await run_all(app, [await flaky.enqueue_async()])
    assert task.state is TaskState.SUCCEEDED
    assert [a.outcome for a in task.attempts] == [Outcome.FAILED, Outcome.SUCCEEDED]
    assert task.attempts[0].error_type == "conveyor.errors.Retry"
    assert 0.09 <= runs[1] - runs[0] < 20  # not the policy's 30 s


async def test_retry_spends_the_budget(app: conveyor.App) -> None:
    @app.task(retry=RetryPolicy(max_attempts=2, fatal=(ValueError,)))
    async def stubborn() -> None:
        raise conveyor.Retry(0) from ValueError("a fatal cause does not matter")

    async with app:
        [task] = await run_all(app, [await stubborn.enqueue_async()])
    assert task.state is TaskState.FAILED and len(task.attempts) == 2


async def test_fatal_names_fail_at_once_and_retry_on_limits_retries(app: conveyor.App) -> None:
    policy = dict(max_attempts=3, initial_interval=0.01, jitter=0)

    @app.task(retry=RetryPolicy(**policy, fatal=(KeyError,)))  # type: ignore[arg-type]
    async def fatal_by_class() -> None:
        raise KeyError("missing")  # a LookupError subclass: fatal by its own class

    @app.task(retry=RetryPolicy(**policy, retry_on=("ConnectionError",)))  # type: ignore[arg-type]
    async def only_connection_errors(kind: str) -> None:
        raise ConnectionResetError("reset") if kind == "reset" else ValueError("bad input")

    @app.task(retry=RetryPolicy(**policy, retry_on=[LookupError], fatal=[KeyError]))  # type: ignore[arg-type]
    def fatal_wins() -> None:
        raise KeyError("both")

    unlucky = app.task(
        name="raise_unlucky",
        process=True,
        retry=RetryPolicy(**policy, fatal=("tests.apps.cpu.Unlucky",)),  # type: ignore[arg-type]
    )(cpu.raise_unlucky)

    async with app:
        handles = [
            await fatal_by_class.enqueue_async(),
            await only_connection_errors.enqueue_async(kind="reset"),
            await only_connection_errors.enqueue_async(kind="value"),
            await fatal_wins.enqueue_async(),
            await unlucky.enqueue_async(),
        ]
        tasks = await run_all(app, handles)
    assert [len(t.attempts) for t in tasks] == [1, 3, 1, 1, 1]
    assert {t.state for t in tasks} == {TaskState.FAILED}
    assert tasks[4].attempts[0].error_type == "tests.apps.cpu.Unlucky"


def test_retry_policy_keeps_and_stores_names() -> None:
    policy = RetryPolicy(retry_on=(ConnectionError, "mylib.Flaky"), fatal=ValueError)  # type: ignore[arg-type]
    assert policy.retry_on == ("ConnectionError", "mylib.Flaky")
    assert policy.fatal == ("ValueError",)
    assert RetryPolicy.from_json(policy.to_json()) == policy
    assert "retry_on" not in RetryPolicy().to_json()  # stored rows stay as they were
    assert policy.gives_up_on(("ValueError", "Exception"))
    assert not policy.gives_up_on(("ConnectionResetError", "ConnectionError", "OSError"))
    assert policy.gives_up_on(("RuntimeError", "Exception"))


@pytest.mark.parametrize(
    "bad",
    [
        {"retry_on": (int,)},
        {"fatal": ("",)},
        {"fatal": 3},
        {"retry_on": tuple(f"e{i}" for i in range(65))},
    ],
)
def test_retry_policy_refuses_what_is_not_an_exception(bad: dict[str, object]) -> None:
    with pytest.raises(ConfigurationError, match="RetryPolicy"):
        RetryPolicy(**bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "make",
    [
        lambda: conveyor.Snooze(-1),
        lambda: conveyor.Retry(float("nan")),
        lambda: conveyor.Snooze(1e12),
        lambda: conveyor.Retry("5"),  # type: ignore[arg-type]
    ],
)
def test_snooze_and_retry_refuse_bad_pauses(make: object) -> None:
    with pytest.raises(ConfigurationError):
        make()  # type: ignore[operator]
