"""How fast conveyor reacts, with real worker processes and the default poll
interval (1 s): a workflow's next step, a message to a busy inbox, a cancel
of a running task, and huge errors next to short leases.

Each phase starts one idle worker process (``benchmarks.bench_app:app``, not
burst) on a fresh store, waits until it has run a warm-up task, then:

1. ``steps``: ``--flows`` step workflows of ``--steps`` no-op steps, one
   after another: per-step latency = the next attempt's ``started_at`` minus
   the previous one's ``finished_at`` (the backend's clock), p50 and p99; then
   ``--flows`` workflows at once: ``steps/s`` = their steps / (last
   ``finished_at`` - first ``created_at``).
2. ``inbox``: a coroutine (``bench_inbox``) that records, for each message,
   the delay from its delivery (its ``created_at``, the backend's clock) to
   the start of the poll that reads it (the worker's clock, same machine).
   Idle: one sender, ``--messages`` messages at 50/s. Busy: ``--senders``
   sender processes, ``--messages`` each, as fast as they can. p50 and p99.
3. ``cancel``: ``--cancels`` times each, an ``async def`` task that sleeps
   and a thread task that waits for ``ctx.should_stop``: from the
   ``cancel`` call to the task's terminal state (this process's clock).
4. ``errors``: a worker with ``--lease 2`` and 16 slots runs 40 neighbours
   that sleep 1 s beside 6 tasks that raise messages of 10, 20 and 50
   million characters (NUL and ``x``): neighbours run more than once (a
   lease given up while the loop stalled) and the longest stored message.

    python benchmarks/reactions.py
    python benchmarks/reactions.py --backends sqlite --phases steps,cancel

Stores as in ``backends.py``; the exit status is 0 only if every check passed.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import multiprocessing
import os
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(ROOT))

from benchmarks.backends import (  # noqa: E402
    BenchmarkError,
    RunningWorker,
    Target,
    parse_backends,
    prepared,
    start_worker,
    wait_finished,
)
from benchmarks.bench_app import (  # noqa: E402
    DEFAULT_URL,
    FLOW_NAME,
    HUGE_ERROR_NAME,
    INBOX_NAME,
    SLEEP_NAME,
    TASK_NAME,
    WAIT_NAME,
    Hop,
    make_app,
)
from benchmarks.throughput import (  # noqa: E402
    READY_TIMEOUT,
    WorkerSpec,
    log,
    paced,
    positive_int,
    quantile,
)
from conveyor import App, Coroutine, TaskHandle, Workflow  # noqa: E402
from conveyor.model import Task, TaskState  # noqa: E402

PHASES = ("steps", "inbox", "cancel", "errors")
Figures = dict[str, Any]


def parse_phases(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names or any(name not in PHASES for name in names):
        raise argparse.ArgumentTypeError(f"expected a subset of {','.join(PHASES)}: {text!r}")
    return names


def millis(values: Sequence[float]) -> Figures:
    ordered = sorted(values)
    return {
        "n": len(ordered),
        "p50_ms": round(1000 * quantile(ordered, 0.5), 1),
        "p99_ms": round(1000 * quantile(ordered, 0.99), 1),
        "max_ms": round(1000 * (ordered[-1] if ordered else 0.0), 1),
    }


async def idle_worker(target: Target, app: App, spec: WorkerSpec) -> RunningWorker:
    worker = start_worker(target, app, spec)
    warm_up = await app.enqueue_async(TASK_NAME, {"i": -1})
    if not await wait_finished(app, [warm_up.id], READY_TIMEOUT, worker):
        await worker.stop()
        raise BenchmarkError(f"[{target.backend}] the worker did not run its warm-up task")
    await asyncio.sleep(1.5)  # idle: past the short claim, waiting for a wake-up
    return worker


async def steps(app: App, args: argparse.Namespace, worker: RunningWorker) -> Figures:
    flow = app.tasks[FLOW_NAME]
    assert isinstance(flow, Workflow)
    gaps: list[float] = []
    per_flow: list[float] = []
    for _ in range(args.flows_in_sequence):
        handle = await flow.start_async(Hop(args.steps - 1))
        [task] = await wait_finished(app, [handle.id], args.timeout, worker) or [None]
        if task is None or task.state is not TaskState.SUCCEEDED or task.finished_at is None:
            raise BenchmarkError(f"a workflow did not finish: {task and task.state}")
        per_flow.append((task.finished_at - task.created_at).total_seconds())
        attempts = task.attempts
        gaps += [
            (later.started_at - earlier.finished_at).total_seconds()
            for earlier, later in itertools.pairwise(attempts)
            if earlier.finished_at is not None
        ]
    handles = [await flow.start_async(Hop(args.steps - 1)) for _ in range(args.flows)]
    finished = await wait_finished(app, [h.id for h in handles], args.timeout, worker)
    if len(finished) != args.flows or any(t.state is not TaskState.SUCCEEDED for t in finished):
        raise BenchmarkError("the parallel workflows did not all succeed")
    first = min(t.created_at for t in finished)
    last = max(t.finished_at for t in finished if t.finished_at is not None)
    return {
        "step_gap": millis(gaps),
        "workflow": millis(per_flow),
        "steps_per_s": round(args.flows * args.steps / (last - first).total_seconds(), 1),
    }


def send_many(url: str, schema: str | None, task_id: int, count: int, rate: float) -> None:
    """A sender process: ``count`` messages to ``task_id`` (``rate`` per s, 0: at once)."""
    app = App(url, schema=schema)

    async def send_all() -> None:
        async with app:

            async def one(i: int) -> None:
                await app.send_async(task_id, {"n": i, "pid": os.getpid()})

            if rate:
                await paced(count, rate, one)
            else:
                for i in range(count):
                    await one(i)

    asyncio.run(send_all())


async def inbox_delays(
    target: Target, app: App, args: argparse.Namespace, worker: RunningWorker, senders: int
) -> Figures:
    receiver = app.tasks[INBOX_NAME]
    assert isinstance(receiver, Coroutine)
    handle = await receiver.start_async({"delays": []})
    await asyncio.sleep(0.5)  # its first poll: it suspends
    rate = 50.0 if senders == 1 else 0.0
    context = multiprocessing.get_context("spawn")
    processes = [
        context.Process(
            target=send_many,
            args=(target.url, target.schema, handle.id, args.messages, rate),
        )
        for _ in range(senders)
    ]
    started = time.monotonic()
    for process in processes:
        process.start()
    for process in processes:
        await asyncio.to_thread(process.join)
    sending = time.monotonic() - started
    await app.send_async(handle.id, {"stop": True})
    [task] = await wait_finished(app, [handle.id], args.timeout, worker) or [None]
    if task is None or task.state is not TaskState.SUCCEEDED:
        raise BenchmarkError(f"the inbox task did not finish: {task and task.state}")
    delays = [d / 1000 for d in task.result]
    if len(delays) != senders * args.messages:
        raise BenchmarkError(f"{len(delays)} of {senders * args.messages} messages were read")
    return {"senders": senders, "sent_per_s": round(len(delays) / sending), **millis(delays)}


async def reached(handle: TaskHandle, condition: Callable[[Task], bool], timeout: float) -> Task:
    """The task once ``condition`` holds (polled every 10 ms)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        task = await handle.get_async()
        if condition(task):
            return task
        await asyncio.sleep(0.01)
    raise BenchmarkError(f"task {handle.id} did not reach the awaited state in time")


async def cancels(app: App, args: argparse.Namespace, worker: RunningWorker) -> Figures:
    figures: Figures = {}
    for name in (SLEEP_NAME, WAIT_NAME):
        waits = []
        for _ in range(args.cancels):
            handle = await app.enqueue_async(name, {"seconds": 120.0})
            await reached(handle, lambda t: t.state is TaskState.IN_PROGRESS, args.timeout)
            await asyncio.sleep(0.2)  # well inside the handler
            started = time.monotonic()
            await app.cancel_async(handle.id)
            task = await reached(handle, lambda t: t.state.is_terminal, args.timeout)
            waits.append(time.monotonic() - started)
            if task.state is not TaskState.CANCELLED:
                raise BenchmarkError(f"a cancelled {name} ended {task.state}")
        figures["async" if name == SLEEP_NAME else "thread"] = millis(waits)
    return figures


async def errors(app: App, args: argparse.Namespace, worker: RunningWorker) -> Figures:
    neighbours = []
    failing = []
    sizes = [(10, True), (20, True), (50, True), (10, False), (20, False), (50, False)]
    for index in range(40):
        neighbours.append((await app.enqueue_async(SLEEP_NAME, {"seconds": 1.0})).id)
        if index % 7 == 3 and sizes:
            megabytes, nul = sizes.pop(0)
            args_ = {"megabytes": megabytes, "nul": nul}
            failing.append((await app.enqueue_async(HUGE_ERROR_NAME, args_)).id)
    done = await wait_finished(app, neighbours + failing, args.timeout, worker)
    if len(done) != len(neighbours) + len(failing):
        raise BenchmarkError("not every task of the errors phase finished")
    by_id = {t.id: t for t in done}
    twice = [i for i in neighbours if len(by_id[i].attempts) > 1]
    lengths = [len(by_id[i].attempts[-1].error_message or "") for i in failing]
    return {
        "neighbours": len(neighbours),
        "neighbours_run_twice": len(twice),
        "huge_errors": len(failing),
        "failed": sum(by_id[i].state is TaskState.FAILED for i in failing),
        "longest_message": max(lengths),
    }


async def run_phase(phase: str, backend: str, args: argparse.Namespace, tag: str) -> Figures | str:
    async with prepared(backend, args, f"{tag}_{phase}") as target:
        app = make_app(target.url, target.schema)
        lease = 2.0 if phase == "errors" else None
        concurrency = 16 if phase == "errors" else 10
        spec = WorkerSpec(target.url, concurrency, False, None, "WARNING", lease=lease)
        async with app:
            worker = await idle_worker(target, app, spec)
            try:
                if phase == "steps":
                    return await steps(app, args, worker)
                if phase == "inbox":
                    idle = await inbox_delays(target, app, args, worker, 1)
                    busy = await inbox_delays(target, app, args, worker, args.senders)
                    return {"idle": idle, "busy": busy}
                if phase == "cancel":
                    return await cancels(app, args, worker)
                return await errors(app, args, worker)
            except BenchmarkError as error:
                return f"FAIL: {error}"
            finally:
                await worker.stop()


async def run(args: argparse.Namespace) -> int:
    tag = f"react_{uuid.uuid4().hex[:8]}"
    results: dict[str, dict[str, Figures | str]] = {}
    for backend in args.backends:
        for phase in args.phases:
            log(f"[{backend}] {phase}")
            figures = await run_phase(phase, backend, args, tag)
            results.setdefault(backend, {})[phase] = figures
            log(f"[{backend}] {phase}: {json.dumps(figures)}")
    print(json.dumps(results, indent=2))
    failed = any(isinstance(f, str) for phases in results.values() for f in phases.values())
    return 1 if failed else 0


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", type=parse_backends, default=["postgres", "sqlite"])
    parser.add_argument("--phases", type=parse_phases, default=list(PHASES))
    parser.add_argument("--url", default=os.environ.get("CONVEYOR_URL") or DEFAULT_URL)
    parser.add_argument("--sqlite-synchronous", choices=("full", "normal"), default="full")
    parser.add_argument("--steps", type=positive_int, default=5, help="steps per workflow")
    parser.add_argument(
        "--flows-in-sequence", type=positive_int, default=5, help="workflows run one by one"
    )
    parser.add_argument("--flows", type=positive_int, default=200, help="workflows run at once")
    parser.add_argument("--messages", type=positive_int, default=250, help="messages per sender")
    parser.add_argument("--senders", type=positive_int, default=4, help="busy sender processes")
    parser.add_argument("--cancels", type=positive_int, default=5, help="cancels per kind")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per wait")
    parser.add_argument("--keep", action="store_true", help="keep the stores")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    return asyncio.run(run(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
