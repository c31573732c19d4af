"""Progress reports with real workers, on every backend: a handler's
``ctx.progress`` is stored throttled (a tight loop costs a few writes, not
one per call), read by handles while the attempt runs, stored once more at
the end so the last value is kept (a failed task shows how far it got),
from thread handlers too; bad values are refused with a typed error that
fails the attempt and stores nothing; events and metrics see the writes."""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime

import pytest
from prometheus_client import CollectorRegistry

import conveyor
from conveyor import Progress, TaskContext, TaskState, testing
from conveyor.backends.params import (
    ClaimParams,
    EnqueueParams,
    ProgressParams,
    ProgressReport,
)
from conveyor.backends.stored import progress_text
from conveyor.events import Event, ProgressStored
from conveyor.metrics import Metrics
from tests.cli_harness import Cli
from tests.conformance.test_tasks import new
from tests.conftest import CLI_ON_REDIS
from tests.worker.helpers import RunningWorker, wait_for, wait_terminal


@pytest.fixture
def app(any_app: conveyor.App) -> conveyor.App:
    return any_app


REPORTS = 50_000


async def test_a_tight_loop_costs_a_few_writes_and_the_last_value_is_kept(
    app: conveyor.App,
) -> None:
    @app.task()
    async def count(ctx: TaskContext) -> int:
        for i in range(REPORTS):
            ctx.progress(i + 1, REPORTS, f"item {i + 1}")
            if i % 5_000 == 0:
                await asyncio.sleep(0.01)  # let the reporter's loop run
        return REPORTS

    async with app:
        handle = await count.enqueue_async()
        async with RunningWorker(app, progress_interval=0.05) as worker:
            [task] = await wait_terminal(app, [handle.id])
            assert worker.progress is not None
            writes = worker.progress.writes
    assert task.state is TaskState.SUCCEEDED
    assert task.progress is not None
    assert (task.progress.done, task.progress.total, task.progress.note) == (
        REPORTS,
        REPORTS,
        f"item {REPORTS}",
    )
    assert task.progress.attempt == 1 and task.progress.fraction == 1.0
    # Ten pauses, each a chance to write, and the last report: a handful of
    # writes for 50,000 reports (one write per report would be 50,000).
    assert 1 <= writes <= 40, writes


async def test_a_running_attempts_progress_is_read_by_its_handle_and_a_failure_keeps_it(
    app: conveyor.App,
) -> None:
    release = threading.Event()

    @app.task(retry=conveyor.RetryPolicy(max_attempts=1))
    def crunch(ctx: TaskContext, n: int) -> None:  # a thread handler
        ctx.progress(3, n, "warming up")
        release.wait(10)
        ctx.progress(7, n)
        raise RuntimeError("disk full")

    async with app:
        handle = await crunch.enqueue_async(n=10)
        async with RunningWorker(app, progress_interval=0.05):

            async def reported() -> bool:
                return await handle.progress_async() is not None

            await wait_for(reported)
            seen = await handle.progress_async()
            assert seen is not None
            assert (seen.done, seen.total, seen.note) == (3, 10, "warming up")
            assert seen.fraction == pytest.approx(0.3)
            running = await handle.get_async()
            assert running.state is TaskState.IN_PROGRESS
            release.set()
            [task] = await wait_terminal(app, [handle.id])
    assert task.state is TaskState.FAILED
    assert task.progress is not None and (task.progress.done, task.progress.note) == (7, None)
    assert handle.progress() == task.progress


async def test_a_bad_report_fails_the_attempt_with_a_typed_error_and_stores_nothing(
    app: conveyor.App,
) -> None:
    @app.task(retry=conveyor.RetryPolicy(max_attempts=1))
    async def overshoot(ctx: TaskContext) -> None:
        ctx.progress(11, 10)

    @app.task(retry=conveyor.RetryPolicy(max_attempts=1))
    async def shouting(ctx: TaskContext) -> None:
        ctx.progress(1, None, "line\nbreak")

    async with app:
        handles = [await overshoot.enqueue_async(), await shouting.enqueue_async()]
        async with RunningWorker(app, progress_interval=0.05):
            tasks = await wait_terminal(app, [h.id for h in handles])
    for task in tasks:
        assert task.state is TaskState.FAILED
        assert task.progress is None
        assert task.last_attempt is not None
        assert task.last_attempt.error_type == "conveyor.errors.ConfigurationError"


async def test_events_and_metrics_see_the_stored_reports(app: conveyor.App) -> None:
    release = asyncio.Event()
    events: list[Event] = []
    metrics = Metrics(CollectorRegistry())

    @app.task()
    async def steps(ctx: TaskContext) -> None:
        ctx.progress(2, 8, "two")
        await release.wait()
        ctx.progress(8, 8, "all")

    async with app:
        app.events.subscribe(events.append)
        metrics.observe(app.events)
        handle = await steps.enqueue_async()
        async with RunningWorker(app, progress_interval=0.05) as worker:
            metrics.track(worker)

            async def stored() -> bool:
                return any(isinstance(e, ProgressStored) for e in events)

            await wait_for(stored)
            registry = metrics.registry
            labels = {"worker": worker.id, "name": "steps", "queue": "default"}
            assert registry.get_sample_value("conveyor_worker_progress_done", labels) == 2
            assert registry.get_sample_value("conveyor_worker_progress_total", labels) == 8
            release.set()
            [task] = await wait_terminal(app, [handle.id])
    reported = [e for e in events if isinstance(e, ProgressStored)]
    assert [(e.task_id, e.done, e.total, e.note) for e in reported][-1] == (
        handle.id,
        8,
        8,
        "all",
    )
    assert reported[0] == ProgressStored(
        reported[0].worker_id, handle.id, 1, "steps", "default", 2, 8, "two"
    )
    counted = metrics.registry.get_sample_value(
        "conveyor_progress_stored_total", {"name": "steps", "queue": "default"}
    )
    assert counted == len(reported)
    assert task.progress == Progress(8, 8, "all", 1, task.progress.at if task.progress else None)  # type: ignore[arg-type]


@CLI_ON_REDIS
def test_show_and_explain_print_the_stored_report_as_text(cli: Cli) -> None:
    with conveyor.App(cli.env["CONVEYOR_URL"], schema=cli.env["CONVEYOR_SCHEMA"]) as app:
        backend = app.portal.run(app.backend())
        [task_id] = app.portal.run(backend.enqueue(EnqueueParams([new(run_at=None)])))
        [claimed] = app.portal.run(
            backend.claim(ClaimParams("w1", ["job"], ["default"], limit=1, lease=600))
        )
        text = progress_text(7, 9, "[bold]x[/bold]", claimed.token.attempt)
        report = ProgressParams("w1", [ProgressReport(claimed.token, text)])
        assert app.portal.run(backend.report_progress(report)) == {claimed.token}
    shown = cli.ok("show", str(task_id))
    assert "progress: 7 of 9 (77%): [bold]x[/bold]" in shown  # stored text, not markup
    data = cli.json("show", str(task_id))
    assert data["progress"]["done"] == 7 and data["progress"]["note"] == "[bold]x[/bold]"
    assert data["progress"]["attempt"] == claimed.token.attempt
    explained = cli.json("explain", str(task_id))
    assert explained["facts"]["progress"]["total"] == 9
    assert "It reported progress 7 of 9 (77%)" in explained["sentence"]


def test_drain_and_inline_mode_store_the_last_report() -> None:
    app = conveyor.App("memory://progress-drain")

    @app.task()
    def resize(ctx: TaskContext, images: int) -> None:
        for i in range(images):
            ctx.progress(i + 1, images, f"image {i + 1}")

    with testing.in_memory(app):
        handle = resize.enqueue(images=3)
        assert testing.drain(app) == 1
        assert (handle.progress() or PLACEHOLDER).summary() == "3 of 3 (100%): image 3"
    with testing.in_memory(app, inline=True):
        handle = resize.enqueue(images=4)
        assert (handle.progress() or PLACEHOLDER).summary() == "4 of 4 (100%): image 4"
    app.close()


PLACEHOLDER = Progress(0, None, "none reported", 0, datetime(2000, 1, 1, tzinfo=UTC))
