"""``conveyor demo``: a worker and a few example tasks, shown as they run.

It never touches real work: on SQLite (the default) it uses a temporary
file of its own, on PostgreSQL a schema of its own, dropped afterwards. It
shows: a task that succeeds, one that fails once and succeeds on
retry, one that fails for good with a traceback, and a long task kept alive
by heartbeats well past its one-second lease.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import urlsplit

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn
from rich.table import Table
from rich.text import Text

from conveyor.app import App
from conveyor.backends import resolve_url
from conveyor.context import TaskContext
from conveyor.model import RetryPolicy, Task
from conveyor.worker.config import WorkerConfig
from conveyor.worker.worker import Worker

DEMO_LEASE = 1.0
LONG_TASK_SECONDS = 3.0


def build_demo_app(url: str | None, schema: str) -> App:
    app = App(url, schema=schema)
    quick_retry = RetryPolicy(max_attempts=3, initial_interval=0.2, jitter=0)

    @app.task(name="demo.greet")
    async def greet(name: str) -> str:
        return f"hello, {name}"

    @app.task(name="demo.flaky", retry=quick_retry)
    async def flaky(ctx: TaskContext) -> str:
        if ctx.attempt == 1:
            raise ConnectionError("the first attempt hits a network fault")
        return f"worked on attempt {ctx.attempt}"

    @app.task(name="demo.broken", retry=RetryPolicy(max_attempts=2, initial_interval=0.2))
    def broken(divisor: int) -> float:
        return 1 / divisor

    @app.task(name="demo.long", lease=DEMO_LEASE)
    async def long(seconds: float) -> str:
        await asyncio.sleep(seconds)
        return f"ran {seconds}s on a {DEMO_LEASE}s lease"

    return app


@asynccontextmanager
async def _demo_url(url: str | None, console: Console) -> AsyncIterator[str]:
    """Where the demo runs: a throwaway SQLite file unless given another backend."""
    resolved = resolve_url(url)
    if urlsplit(resolved).scheme.lower() != "sqlite":
        yield resolved
        return
    with tempfile.TemporaryDirectory(prefix="conveyor-demo-") as folder:
        path = os.path.join(folder, "demo.db")
        console.print(f"running the demo on SQLite in {path} (removed afterwards)")
        yield f"sqlite:///{path}"


async def run_demo(url: str | None, console: Console) -> list[Task]:
    """Run the demo; return the finished tasks."""
    async with _demo_url(url, console) as where:
        return await _run(where, console)


async def _run(url: str, console: Console) -> list[Task]:
    schema = f"conveyor_demo_{uuid.uuid4().hex[:8]}"
    app = build_demo_app(url, schema)
    async with app:
        backend = await app.backend()
        handles = [
            await app.enqueue_async("demo.greet", {"name": "world"}),
            await app.enqueue_async("demo.flaky"),
            await app.enqueue_async("demo.broken", {"divisor": 0}),
            await app.enqueue_async("demo.long", {"seconds": LONG_TASK_SECONDS}),
        ]
        worker = Worker(
            app,
            WorkerConfig(concurrency=4, poll_interval=0.1, lease=DEMO_LEASE, handle_signals=False),
        )
        running = asyncio.create_task(worker.run())
        try:
            tasks = await _watch(app, [h.id for h in handles], console)
        finally:
            worker.request_stop(immediate=True)
            await running
            await backend.destroy()
    return tasks


async def _watch(app: App, ids: list[int], console: Console) -> list[Task]:
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        console=console,
        transient=True,
    ) as progress:
        bar = progress.add_task("running the demo tasks", total=len(ids))
        while True:
            tasks = [t for t in [await app.get_async(i) for i in ids] if t is not None]
            done = sum(t.state.is_terminal for t in tasks)
            progress.update(bar, completed=done)
            if done == len(ids):
                return tasks
            await asyncio.sleep(0.1)


def print_report(tasks: list[Task], console: Console) -> None:
    table = Table("task", "state", "attempts", "result or last error")
    for task in tasks:
        last = task.last_attempt
        outcome = (
            repr(task.result)
            if task.result is not None
            else f"{last.error_type}: {last.error_message}"
            if last
            else ""
        )
        attempts = ", ".join(f"{a.number}:{a.outcome.value}" for a in task.attempts)
        table.add_row(task.name, task.state.value, attempts, outcome)
    console.print(table)
    failed = [t for t in tasks if t.last_attempt and t.last_attempt.traceback]
    for task in failed[-1:]:
        console.print(Text(f"traceback of {task.name}'s last attempt:", style="bold"))
        console.print(Text(task.last_attempt.traceback or "" if task.last_attempt else ""))
