"""The same workload on every backend (PostgreSQL, SQLite, memory), in one table.

For each backend in ``--backends`` (default ``postgres,sqlite,memory``), in a
fresh store, through the App API only:

1. Enqueue ``--tasks`` no-op tasks (``bench_noop``, see ``bench_app.py``) with
   ``App.enqueue_many_async`` in batches of ``--batch``. Timed over the inserts
   only (opening the backend and migrating are not): ``enqueue/s``.
2. Drain them with ONE burst worker, ``--concurrency`` slots, timed from spawn
   to exit: ``processed/s`` = tasks / that wall time. PostgreSQL and SQLite
   run a worker process, ``python -m conveyor.cli worker benchmarks.bench_app:app
   --burst --concurrency C`` with ``CONVEYOR_URL`` (and ``CONVEYOR_SCHEMA``)
   set, so interpreter start-up and the burst exit are included. The memory
   store lives only in this process, so its worker runs here, on this event
   loop (``App.worker(burst=True, ...)``).
3. Verify that every task succeeded (``list_tasks_async``) and, on a sample of
   ids, that each has exactly one attempt, outcome ``succeeded`` (``get_async``).
4. Latency: an idle worker (not burst; ``--latency-concurrency`` slots,
   ``--poll-interval``) runs one warm-up task; one second later, enqueue one
   task at a time with ``App.enqueue_async`` at ``--rate`` per second for
   ``--duration`` seconds, wait until all succeeded, stop the worker, and report
   enqueue-to-start latency ``attempts[0].started_at - created_at`` (both
   stamped by the backend's own clock), p50 and p99 in ms.
5. Workflows: ``--workflows`` step workflows (default 1000) of ``--steps``
   no-op steps each (default 10), drained by one burst worker as in 2:
   ``steps/s`` = every step run / the worker's wall time, checked: every
   workflow succeeded with exactly ``--steps`` attempts, all succeeded.
6. Messages: two coroutine tasks (``bench_ping`` and the child it spawns)
   send a ball back and forth ``--rounds`` times, run by an idle worker as
   in 4 (after a warm-up task): ``msgs/s`` = messages / (the root's
   ``finished_at - created_at``, the backend's clock); ``send→poll p50`` = the
   median delay from a message's delivery (its ``created_at``, the backend's
   clock) to the start of the poll that reads it (the worker's clock, same
   machine), at 0.1 ms resolution. Checked: the ball reached ``--rounds``.
   With ``--pairs N``, N such pairs play at once: ``msgs/s`` over all of
   them, from the first root's creation to the last one's end.

    python benchmarks/backends.py --tasks 20000
    python benchmarks/backends.py --backends sqlite --sqlite-synchronous normal
    python benchmarks/backends.py --tasks 2000 --duration 2 --json

Stores: PostgreSQL (``--url``, else ``CONVEYOR_URL``, else
``postgresql://127.0.0.1:5432/test``) in a schema ``bench_<random>``, dropped
at the end; SQLite in a new file in a temporary directory
(``?synchronous=full`` unless ``--sqlite-synchronous normal``), removed at the
end; ``memory://bench_<random>``. ``--keep`` keeps the schema and the SQLite
file. The exit status is 0 only if every check passed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import os
import platform
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from conveyor import App, Coroutine, Workflow
from conveyor.model import Outcome, Task, TaskState

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(ROOT))

from benchmarks.bench_app import (  # noqa: E402
    DEFAULT_URL,
    FLOW_NAME,
    PING_NAME,
    TASK_NAME,
    Hop,
    make_app,
)
from benchmarks.throughput import (  # noqa: E402
    POLL_SECONDS,
    READY_TIMEOUT,
    STOP_TIMEOUT,
    WorkerSpec,
    drop_schema,
    environment,
    log,
    paced,
    positive_float,
    positive_int,
    quantile,
    stop_worker,
    worker_command,
)

BACKENDS = ("postgres", "sqlite", "memory")
SAMPLE = 200
"""Tasks whose attempt log is checked one by one after the drain."""


class BenchmarkError(Exception):
    """A run that cannot go on (a worker that never became ready, ...)."""


def log_level(text: str) -> str:
    if text.upper() not in logging.getLevelNamesMapping():
        raise argparse.ArgumentTypeError(f"not a logging level: {text!r}")
    return text.upper()


def parse_backends(text: str) -> list[str]:
    names = list(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    unknown = [name for name in names if name not in BACKENDS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated subset of {','.join(BACKENDS)}: {text!r}"
        )
    return names


# -- the store under test ------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """One backend under test: its URL and, on PostgreSQL, its schema."""

    backend: str
    url: str
    schema: str | None = None

    @property
    def in_process(self) -> bool:
        """The memory store exists only in this process: its worker runs here."""
        return self.backend == "memory"

    def app(self) -> App:
        return make_app(self.url, self.schema)

    def worker_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["CONVEYOR_URL"] = self.url
        env.pop("CONVEYOR_SCHEMA", None)
        if self.schema is not None:
            env["CONVEYOR_SCHEMA"] = self.schema
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        return env


@contextlib.asynccontextmanager
async def prepared(backend: str, args: argparse.Namespace, tag: str) -> AsyncIterator[Target]:
    """A fresh, empty store for ``backend``, removed afterwards unless ``--keep``."""
    if backend == "postgres":
        target = Target(backend, args.url, tag)
        try:
            yield target
        finally:
            if args.keep:
                log(f"[postgres] kept schema {tag}")
            else:
                await drop_schema(args.url, tag)
    elif backend == "sqlite":
        directory = Path(tempfile.mkdtemp(prefix=f"{tag}_"))
        path = directory / "conveyor.db"
        try:
            yield Target(backend, f"sqlite:///{path}?{sqlite_options(args)}")
        finally:
            if args.keep:
                log(f"[sqlite] kept {path}")
            else:
                shutil.rmtree(directory, ignore_errors=True)
    else:
        yield Target(backend, f"memory://{tag}")


def sqlite_options(args: argparse.Namespace) -> str:
    return f"synchronous={args.sqlite_synchronous}"


# -- workers: a process, or a task on this loop --------------------------------


class RunningWorker(Protocol):
    def alive(self) -> bool: ...

    async def wait(self, timeout: float) -> int:
        """The exit status once it ends by itself (burst); -1 after a timeout."""
        ...

    async def stop(self) -> int:
        """Stop it gracefully (SIGTERM or ``request_stop``); its exit status."""
        ...


class ProcessWorker:
    """``python -m conveyor.cli worker benchmarks.bench_app:app`` in a child process."""

    def __init__(self, target: Target, spec: WorkerSpec) -> None:
        self.process = subprocess.Popen(
            worker_command(spec),
            cwd=ROOT,
            env=target.worker_env(),
            stdout=sys.stderr,  # keep our stdout clean for --json
            stderr=sys.stderr,
        )

    def alive(self) -> bool:
        return self.process.poll() is None

    async def wait(self, timeout: float) -> int:
        try:
            return await asyncio.to_thread(self.process.wait, timeout)
        except subprocess.TimeoutExpired:
            log(f"the worker did not finish in {timeout}s; stopping it")
            await self.stop()
            return -1

    async def stop(self) -> int:
        return await stop_worker(self.process)


class LoopWorker:
    """``App.worker(...).run()`` as a task on this process's event loop."""

    def __init__(self, app: App, spec: WorkerSpec) -> None:
        config: dict[str, Any] = {
            "concurrency": spec.concurrency,
            "burst": spec.burst,
            "handle_signals": False,
        }
        if spec.poll_interval is not None:
            config["poll_interval"] = spec.poll_interval
        if spec.lease is not None:
            config["lease"] = spec.lease
        self.worker = app.worker(**config)
        self.task = asyncio.create_task(self.worker.run(), name="bench-worker")

    def alive(self) -> bool:
        return not self.task.done()

    def _status(self) -> int:
        if self.task.cancelled():
            return -1
        error = self.task.exception()
        if error is not None:
            log(f"the in-process worker failed: {error!r}")
            return 1
        return 0

    async def wait(self, timeout: float) -> int:
        done, _ = await asyncio.wait({self.task}, timeout=timeout)
        if not done:
            log(f"the worker did not finish in {timeout}s; stopping it")
            await self.stop()
            return -1
        return self._status()

    async def stop(self) -> int:
        if not self.task.done():
            self.worker.request_stop()
            done, _ = await asyncio.wait({self.task}, timeout=STOP_TIMEOUT)
            if not done:
                self.task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self.task
        return self._status()


def start_worker(target: Target, app: App, spec: WorkerSpec) -> RunningWorker:
    if target.in_process:
        return LoopWorker(app, spec)
    return ProcessWorker(target, spec)


# -- the workload ----------------------------------------------------------------


@dataclass
class BackendResult:
    backend: str
    url: str
    schema: str | None
    note: str
    tasks: int
    enqueue_seconds: float | None = None
    enqueue_per_s: float | None = None
    drain_seconds: float | None = None
    """Worker wall time, spawn to exit (start-up and the burst exit included)."""
    processed_per_s: float | None = None
    drain_exit_code: int | None = None
    latency_sent: int | None = None
    latency_rate_achieved: float | None = None
    latency_p50_ms: float | None = None
    latency_p90_ms: float | None = None
    latency_p99_ms: float | None = None
    latency_max_ms: float | None = None
    latency_exit_code: int | None = None
    workflow_steps: int | None = None
    steps_per_s: float | None = None
    messages: int | None = None
    messages_per_s: float | None = None
    send_to_poll_p50_ms: float | None = None
    step_rounds: list[tuple[float, float]] = field(default_factory=list)
    """(processed/s, steps/s) of each ``--step-rounds`` round, in order."""
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def attempt_problem(task: Task | None, task_id: int) -> str | None:
    """Why ``task`` is not one clean success (None if it is)."""
    if task is None:
        return f"task {task_id} is missing"
    if task.state is not TaskState.SUCCEEDED:
        return f"task {task_id} is {task.state}"
    outcomes = [a.outcome.value for a in task.attempts]
    if outcomes != [Outcome.SUCCEEDED.value]:
        return f"task {task_id} has attempts {outcomes}, expected one succeeded"
    return None


async def enqueue_all(app: App, tasks: int, batch: int) -> tuple[list[int], float]:
    """Enqueue ``tasks`` no-op tasks in batches; their ids and the seconds it took."""
    ids: list[int] = []
    started = time.perf_counter()
    for first in range(0, tasks, batch):
        payloads = [{"i": i} for i in range(first, min(first + batch, tasks))]
        ids += [handle.id for handle in await app.enqueue_many_async(TASK_NAME, payloads)]
    return ids, time.perf_counter() - started


async def stored(app: App) -> dict[TaskState, int]:
    """How many ``TASK_NAME`` tasks the store holds, by state."""
    found: dict[TaskState, int] = dict.fromkeys(TaskState, 0)
    for count in await app.count_tasks_async():
        if count.name == TASK_NAME:
            found[count.state] += count.count
    return found


async def verify_drain(app: App, ids: Sequence[int], before: dict[TaskState, int]) -> list[str]:
    """Every task of ``ids`` ran once and succeeded, and no other was stored
    since ``before`` (the store's counts when they were enqueued)."""
    problems: list[str] = []
    after = await stored(app)
    added = sum(after.values()) - sum(before.values())
    succeeded = after[TaskState.SUCCEEDED] - before[TaskState.SUCCEEDED]
    if added != len(ids):
        problems.append(f"{added} tasks stored, {len(ids)} enqueued")
    if succeeded != len(ids):
        problems.append(f"{succeeded} of {len(ids)} tasks succeeded")
    sample = random.Random(0).sample(list(ids), min(SAMPLE, len(ids)))
    found = [attempt_problem(await app.get_async(task_id), task_id) for task_id in sample]
    wrong = [problem for problem in found if problem is not None]
    if wrong:
        problems.append(f"{len(wrong)} of {len(sample)} sampled tasks are wrong, e.g. {wrong[0]}")
    return problems


async def throughput(
    target: Target, app: App, args: argparse.Namespace, result: BackendResult
) -> None:
    name = target.backend
    log(f"[{name}] enqueueing {args.tasks} tasks in batches of {args.batch}")
    before = await stored(app)
    ids, result.enqueue_seconds = await enqueue_all(app, args.tasks, args.batch)
    result.enqueue_per_s = len(ids) / result.enqueue_seconds
    log(f"[{name}] enqueued in {result.enqueue_seconds:.3f}s; draining ({result.note})")
    spec = WorkerSpec(target.url, args.concurrency, True, None, args.worker_log_level)
    started = time.perf_counter()
    worker = start_worker(target, app, spec)
    try:
        result.drain_exit_code = await worker.wait(args.timeout)
    finally:
        if worker.alive():
            await worker.stop()
    result.drain_seconds = time.perf_counter() - started
    if result.drain_exit_code != 0:
        result.problems.append(f"the drain worker exited with {result.drain_exit_code}")
    result.problems += await verify_drain(app, ids, before)
    if not result.problems:
        result.processed_per_s = len(ids) / result.drain_seconds
        log(f"[{name}] drained in {result.drain_seconds:.3f}s")


async def workflows(
    target: Target, app: App, args: argparse.Namespace, result: BackendResult
) -> None:
    """``--workflows`` workflows of ``--steps`` no-op steps each, drained by one
    burst worker: steps/s = every step run / the worker's wall time."""
    if not args.workflows:
        return
    flow = app.tasks[FLOW_NAME]
    assert isinstance(flow, Workflow)
    log(f"[{target.backend}] starting {args.workflows} workflows of {args.steps} steps")
    new = [flow.new_workflow(Hop(args.steps - 1)) for _ in range(args.workflows)]
    ids = [handle.id for handle in await app.enqueue_new_async(new)]
    spec = WorkerSpec(target.url, args.concurrency, True, None, args.worker_log_level)
    started = time.perf_counter()
    worker = start_worker(target, app, spec)
    try:
        code = await worker.wait(args.timeout)
    finally:
        if worker.alive():
            await worker.stop()
    seconds = time.perf_counter() - started
    if code != 0:
        result.problems.append(f"the workflow worker exited with {code}")
    finished = [await app.get_async(task_id) for task_id in ids]
    wrong = [
        task_id
        for task_id, task in zip(ids, finished, strict=True)
        if task is None
        or task.state is not TaskState.SUCCEEDED
        or [a.outcome for a in task.attempts] != [Outcome.SUCCEEDED] * args.steps
    ]
    if wrong:
        result.problems.append(f"{len(wrong)} workflows did not run every step once")
        return
    result.workflow_steps = args.workflows * args.steps
    result.steps_per_s = result.workflow_steps / seconds
    log(f"[{target.backend}] {result.workflow_steps} steps in {seconds:.3f}s")


async def pingpong(
    target: Target, app: App, args: argparse.Namespace, result: BackendResult
) -> None:
    """Two coroutines send a ball back and forth ``--rounds`` times (``--pairs``
    pairs at once), run by an idle long-running worker (as for the latency
    run: wake-ups, not polls, start each poll); timed by the backend's clock,
    from the first root's creation to the last one's end."""
    if not args.rounds:
        return
    ping = app.tasks[PING_NAME]
    assert isinstance(ping, Coroutine)
    spec = WorkerSpec(
        target.url, args.latency_concurrency, False, args.poll_interval, args.worker_log_level
    )
    worker = start_worker(target, app, spec)
    try:
        warm_up = await app.enqueue_async(TASK_NAME, {"i": -2})
        if not await wait_finished(app, [warm_up.id], READY_TIMEOUT, worker):
            raise BenchmarkError(f"[{target.backend}] the ping-pong worker did not start")
        log(f"[{target.backend}] ping-pong for {args.rounds} rounds, {args.pairs} pair(s)")
        state = {"role": "ping", "rounds": args.rounds, "hist": {}}
        handles = await app.enqueue_new_async(
            [ping.new_coroutine(state) for _ in range(args.pairs)]
        )
        tasks = await wait_finished(app, [h.id for h in handles], args.timeout, worker) or []
    finally:
        code = await worker.stop()
    if code != 0:
        result.problems.append(f"the ping-pong worker exited with {code}")
    unfinished = [
        t for t in tasks if t.state is not TaskState.SUCCEEDED or t.result["ball"] < args.rounds
    ]
    if len(tasks) < args.pairs or unfinished:
        result.problems.append(f"the ping-pong did not finish: {len(tasks)} of {args.pairs} ended")
        return
    ends = [t.finished_at for t in tasks if t.finished_at is not None]
    seconds = (max(ends) - min(t.created_at for t in tasks)).total_seconds()
    hist: dict[float, int] = {}
    for task in tasks:
        for bucket, count in task.result["hist"].items():
            hist[float(bucket)] = hist.get(float(bucket), 0) + count
    result.messages = sum(hist.values())
    result.messages_per_s = result.messages / seconds
    result.send_to_poll_p50_ms = median_of(hist)
    log(f"[{target.backend}] {result.messages} messages in {seconds:.3f}s")


def median_of(hist: dict[float, int]) -> float:
    """The median of a histogram {value: count}."""
    total, seen = sum(hist.values()), 0
    for value in sorted(hist):
        seen += hist[value]
        if seen * 2 >= total:
            return value
    return math.nan


async def wait_finished(
    app: App, ids: Sequence[int], timeout: float, worker: RunningWorker
) -> list[Task]:
    """Poll until every task of ``ids`` is terminal (or the timeout, or the worker
    ends); the terminal ones, with their attempts."""
    finished: list[Task] = []
    deadline = time.monotonic() + timeout
    for task_id in ids:
        while True:
            task = await app.get_async(task_id)
            if task is not None and task.state.is_terminal:
                finished.append(task)
                break
            if time.monotonic() > deadline or not worker.alive():
                return finished
            await asyncio.sleep(POLL_SECONDS)
    return finished


async def paced_enqueue(app: App, total: int, rate: float) -> tuple[list[int], float]:
    """Enqueue ``total`` tasks one at a time on a fixed schedule of ``rate`` per
    second; their ids and the seconds it took."""
    ids: list[int] = []

    async def send(i: int) -> None:
        ids.append((await app.enqueue_async(TASK_NAME, {"i": i})).id)

    return ids, await paced(total, rate, send)


async def latency(
    target: Target, app: App, args: argparse.Namespace, result: BackendResult
) -> None:
    name = target.backend
    spec = WorkerSpec(
        target.url, args.latency_concurrency, False, args.poll_interval, args.worker_log_level
    )
    worker = start_worker(target, app, spec)
    try:
        warm_up = await app.enqueue_async(TASK_NAME, {"i": -1})
        if not await wait_finished(app, [warm_up.id], READY_TIMEOUT, worker):
            raise BenchmarkError(f"[{name}] the latency worker did not run its warm-up task")
        await asyncio.sleep(1.0)  # let it go idle: waiting for a wake-up
        total = max(1, round(args.rate * args.duration))
        log(f"[{name}] latency: enqueueing {total} tasks at {args.rate:g}/s")
        ids, sent_seconds = await paced_enqueue(app, total, args.rate)
        result.latency_rate_achieved = total / max(sent_seconds, 1e-9)
        log(f"[{name}] latency: sent in {sent_seconds:.2f}s ({result.latency_rate_achieved:.0f}/s)")
        tasks = await wait_finished(app, ids, args.timeout, worker)
    finally:
        result.latency_exit_code = await worker.stop()
    if result.latency_exit_code != 0:
        result.problems.append(f"the latency worker exited with {result.latency_exit_code}")
    if len(tasks) != total:
        result.problems.append(f"latency: {len(tasks)} of {total} tasks finished")
    result.problems += [p for t in tasks if (p := attempt_problem(t, t.id)) is not None]
    waits = sorted(
        (t.attempts[0].started_at - t.created_at).total_seconds() for t in tasks if t.attempts
    )
    result.latency_sent = total
    result.latency_p50_ms = 1000 * quantile(waits, 0.5)
    result.latency_p90_ms = 1000 * quantile(waits, 0.9)
    result.latency_p99_ms = 1000 * quantile(waits, 0.99)
    result.latency_max_ms = 1000 * (waits[-1] if waits else 0.0)


def worker_note(target: Target, args: argparse.Namespace) -> str:
    if target.in_process:
        return f"worker in-process, concurrency {args.concurrency}"
    return f"1 worker process, concurrency {args.concurrency}"


async def step_rounds(
    target: Target, app: App, args: argparse.Namespace, result: BackendResult
) -> None:
    """Steps next to plain tasks, ``--step-rounds`` times in one store: each
    round a plain drain and a workflow drain, in turn first (so that a drift
    of the machine's speed weighs on both); the first round is the run's own
    drains above. processed/s and steps/s become the medians of the rounds."""
    result.step_rounds.append(_rates(result))
    for n in range(1, args.step_rounds):
        phases = [throughput, workflows] if n % 2 == 0 else [workflows, throughput]
        for phase in phases:
            await phase(target, app, args, result)
            if not result.ok:
                return
        result.step_rounds.append(_rates(result))
    result.processed_per_s = statistics.median(p for p, _ in result.step_rounds)
    result.steps_per_s = statistics.median(s for _, s in result.step_rounds)


def _rates(result: BackendResult) -> tuple[float, float]:
    """(processed/s, steps/s), both measured."""
    plain, steps = result.processed_per_s, result.steps_per_s
    assert plain is not None
    assert steps is not None
    return plain, steps


def step_ratios(result: BackendResult) -> str:
    """The steps/plain ratio of each round, and of the medians."""
    ratios = ", ".join(f"{s / p:.0%}" for p, s in result.step_rounds)
    plain, steps = _rates(result)
    medians = steps / plain
    return f"{result.backend}: steps/plain by round {ratios}; of the medians {medians:.0%}"


async def run_backend(backend: str, args: argparse.Namespace, tag: str) -> BackendResult:
    async with prepared(backend, args, tag) as target:
        result = BackendResult(
            backend, target.url, target.schema, worker_note(target, args), args.tasks
        )
        log(f"[{backend}] {target.url}" + (f" schema {target.schema}" if target.schema else ""))
        app = target.app()
        try:
            async with app:  # opens the backend and migrates the fresh store, untimed
                await throughput(target, app, args, result)
                if result.ok:  # else tasks left pending would skew the latencies
                    await latency(target, app, args, result)
                if result.ok:
                    await workflows(target, app, args, result)
                if result.ok and args.step_rounds > 1:
                    await step_rounds(target, app, args, result)
                if result.ok:
                    await pingpong(target, app, args, result)
        except Exception as error:  # report it, clean up, go on with the next backend
            traceback.print_exc(file=sys.stderr)
            result.problems.append(f"{type(error).__name__}: {error}")
    for problem in result.problems[:10]:
        log(f"[{backend}] FAIL: {problem}")
    return result


# -- report ------------------------------------------------------------------------


def _number(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table(results: Sequence[BackendResult]) -> str:
    header = (
        f"{'backend':<9} {'enqueue/s':>10} {'processed/s':>12} {'latency p50 ms':>15} "
        f"{'p99 ms':>7} {'steps/s':>8} {'msgs/s':>7} {'send→poll p50 ms':>17} {'check':>5}  note"
    )
    rows = []
    for r in results:
        rows.append(
            f"{r.backend:<9} {_number(r.enqueue_per_s, ',.0f'):>10} "
            f"{_number(r.processed_per_s, ',.0f'):>12} {_number(r.latency_p50_ms, '.1f'):>15} "
            f"{_number(r.latency_p99_ms, '.1f'):>7} {_number(r.steps_per_s, ',.0f'):>8} "
            f"{_number(r.messages_per_s, ',.0f'):>7} {_number(r.send_to_poll_p50_ms, '.1f'):>17} "
            f"{'ok' if r.ok else 'FAIL':>5}  {r.note}"
        )
    return "\n".join([header, "-" * max(len(line) for line in [header, *rows]), *rows])


async def describe(args: argparse.Namespace) -> dict[str, Any]:
    found: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
    }
    if "postgres" in args.backends:
        found.update(await environment(args.url))
    if "sqlite" in args.backends:
        found["sqlite_url_options"] = sqlite_options(args)
    return found


def summary(env: dict[str, Any], args: argparse.Namespace) -> list[str]:
    lines = [f"Python {env['python']}, {env['cpus']} CPUs"]
    if "postgresql" in env:
        lines.append(
            f"PostgreSQL {env['postgresql']} (synchronous_commit={env['synchronous_commit']})"
        )
    if "sqlite_url_options" in env:
        lines.append(f"SQLite ?{env['sqlite_url_options']} (journal_mode=wal)")
    lines.append(
        f"{args.tasks} tasks, batches of {args.batch}; latency: {args.rate:g}/s for "
        f"{args.duration:g}s, worker concurrency {args.latency_concurrency}, "
        f"poll interval {args.poll_interval:g}s"
    )
    return lines


async def run(args: argparse.Namespace) -> int:
    tag = f"bench_{uuid.uuid4().hex[:8]}"
    # SIGTERM, like Ctrl-C, cancels the run: the finally blocks stop the worker
    # and remove the store.
    this = asyncio.current_task()
    assert this is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, this.cancel)
    # The in-process (memory) worker logs through logging, like the CLI's --log-level.
    logging.basicConfig(stream=sys.stderr, level=args.worker_log_level)
    env = await describe(args)
    results = [await run_backend(backend, args, tag) for backend in args.backends]
    rounds = [step_ratios(r) for r in results if r.ok and len(r.step_rounds) > 1]
    text = "\n".join([*summary(env, args), "", table(results), *rounds])
    if args.json:
        log(text)
        report = {
            "environment": env,
            "parameters": {k: v for k, v in vars(args).items() if k not in ("json", "keep")},
            "results": [{**asdict(r), "ok": r.ok} for r in results],
        }
        print(json.dumps(report, indent=2))
    else:
        print(text)
    return 0 if all(r.ok for r in results) else 1


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Run the same enqueue/drain/latency workload on each conveyor backend.",
    )
    parser.add_argument(
        "--backends",
        type=parse_backends,
        default=list(BACKENDS),
        help="comma-separated subset of postgres,sqlite,memory (default: all three)",
    )
    parser.add_argument(
        "--url",
        default=os.environ.get("CONVEYOR_URL") or DEFAULT_URL,
        help="the postgres backend's URL (default: CONVEYOR_URL, else %(default)s)",
    )
    parser.add_argument(
        "--sqlite-synchronous",
        choices=("full", "normal"),
        default="full",
        help="the SQLite URL's ?synchronous= (default: %(default)s)",
    )
    parser.add_argument(
        "--tasks", type=positive_int, default=20_000, help="tasks to drain (default %(default)s)"
    )
    parser.add_argument(
        "--workflows",
        type=int,
        default=1_000,
        help="step workflows to drain after the latency run, 0 to skip (default %(default)s)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1_000,
        help="ping-pong messages between two coroutines, 0 to skip (default %(default)s)",
    )
    parser.add_argument(
        "--pairs",
        type=positive_int,
        default=1,
        help="ping-pong pairs playing at once (default %(default)s)",
    )
    parser.add_argument(
        "--steps", type=positive_int, default=10, help="steps per workflow (default %(default)s)"
    )
    parser.add_argument(
        "--batch",
        type=positive_int,
        default=5_000,
        help="tasks per enqueue_many (default %(default)s)",
    )
    parser.add_argument(
        "--concurrency",
        type=positive_int,
        default=50,
        help="drain worker's concurrency (default %(default)s)",
    )
    parser.add_argument(
        "--latency-concurrency",
        type=positive_int,
        default=10,
        help="latency worker's concurrency (default %(default)s)",
    )
    parser.add_argument(
        "--poll-interval",
        type=positive_float,
        default=1.0,
        help="latency worker's --poll-interval (default %(default)s s: wake-ups dominate)",
    )
    parser.add_argument(
        "--rate", type=positive_float, default=200.0, help="latency phase: tasks enqueued per s"
    )
    parser.add_argument(
        "--duration", type=positive_float, default=5.0, help="latency phase: seconds enqueueing"
    )
    parser.add_argument(
        "--timeout",
        type=positive_float,
        default=600.0,
        help="seconds per worker run (default %(default)s)",
    )
    parser.add_argument(
        "--step-rounds",
        type=positive_int,
        default=1,
        help="plain and workflow drains this many times, taking turns; report the medians"
        " and each round's steps/plain (default %(default)s)",
    )
    parser.add_argument(
        "--worker-log-level", type=log_level, default="WARNING", help="the workers' --log-level"
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the PostgreSQL schema and the SQLite file"
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return asyncio.run(run(args))
    except KeyboardInterrupt:
        log("interrupted (SIGINT); workers stopped, stores removed")
        return 128 + signal.SIGINT
    except asyncio.CancelledError:  # only SIGTERM cancels the run
        log("interrupted (SIGTERM); workers stopped, stores removed")
        return 128 + signal.SIGTERM


if __name__ == "__main__":
    sys.exit(main())
