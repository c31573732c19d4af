"""The App the benchmark's worker runs: a no-op ``async def`` task and a
workflow of no-op steps.

``throughput.py`` starts ``python -m conveyor.cli worker benchmarks.bench_app:app``
with ``CONVEYOR_URL`` and ``CONVEYOR_SCHEMA`` set, so the worker process imports
``app`` from here; the benchmark itself builds its own App with :func:`make_app`
(same task, explicit URL and schema) to enqueue.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import conveyor
from conveyor import App, TaskContext

DEFAULT_URL = "postgresql://127.0.0.1:5432/test"
TASK_NAME = "bench_noop"
FLOW_NAME = "bench_flow"


@dataclass
class Hop:
    """A no-op workflow step: ``left`` more hops, then done."""

    left: int

    async def run(self, ctx: TaskContext) -> conveyor.Next | conveyor.Done:
        return conveyor.next(Hop(self.left - 1)) if self.left > 0 else conveyor.done()


def make_app(url: str | None = None, schema: str | None = None) -> App:
    """An App with the no-op task; None reads CONVEYOR_URL / CONVEYOR_SCHEMA."""
    application = App(url or os.environ.get("CONVEYOR_URL") or DEFAULT_URL, schema=schema)

    @application.task(name=TASK_NAME)
    async def bench_noop(i: int = 0) -> None:
        """Do nothing: the benchmark measures conveyor, not the handler."""
        return None

    application.workflow(FLOW_NAME).step(Hop)
    return application


app = make_app()
