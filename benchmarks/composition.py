"""Groups and chords against plain tasks, on PostgreSQL, SQLite and Redis.

For each backend in ``--backends`` (default ``postgres,sqlite,redis``):

1. **Drain.** ``--rounds`` rounds; in each, in a fresh store each time, and
   alternating which goes first: ``--tasks`` plain no-op tasks
   (``bench_noop``, stored with ``enqueue_many_async``), then a group of as
   many no-op members (``group(bench_noop.s(i=i) ...)``, one enqueue), each
   drained by ONE burst worker process (``python -m conveyor.cli worker
   benchmarks.bench_app:app --burst --concurrency C``), timed from spawn to
   exit. Reported: the median tasks/s of each and ``group/plain``, the
   median of the rounds' ratios (the target is >= 0.80). Checked: every
   task succeeded.
2. **Callback latency.** An idle worker process (``--concurrency`` slots)
   runs ``--chords`` chords one after another, each of ``--members`` no-op
   members and a callback (``bench_collect``, receiving the outcomes);
   for each, the delay from the last member's end (its ``finished_at``) to
   the start of the callback's attempt, both by the store's clock: p50 and
   p99 in ms. Checked: each callback ran once and received every member.

    python benchmarks/composition.py
    python benchmarks/composition.py --backends postgres --tasks 10000 --rounds 3
    python benchmarks/composition.py --json

Stores: PostgreSQL (``--url``, else ``CONVEYOR_URL``, else
``postgresql://127.0.0.1:5432/test``) in a fresh schema per run; SQLite in a
fresh file; Redis (``--redis-url``, default ``redis://127.0.0.1:6379/0``)
under a fresh key prefix. Each is destroyed afterwards. The exit status is
0 only if every check passed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(ROOT))

from benchmarks.backends import Target, start_worker  # noqa: E402
from benchmarks.bench_app import COLLECT_NAME, TASK_NAME  # noqa: E402
from benchmarks.throughput import WorkerSpec, log  # noqa: E402
from conveyor import App, TaskState, chord, group  # noqa: E402

DEFAULT_URL = "postgresql://127.0.0.1:5432/test"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


@dataclass
class Result:
    backend: str
    plain_per_s: list[float] = field(default_factory=list)
    group_per_s: list[float] = field(default_factory=list)
    ratios: list[float] = field(default_factory=list)
    callback_ms: list[float] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ratio(self) -> float | None:
        return statistics.median(self.ratios) if self.ratios else None


@contextlib.asynccontextmanager
async def fresh(backend: str, args: argparse.Namespace) -> AsyncIterator[tuple[Target, App]]:
    """A fresh, migrated store of ``backend`` and an App on it; destroyed after."""
    tag = f"bench_{uuid.uuid4().hex[:10]}"
    directory = None
    if backend == "postgres":
        target = Target(backend, args.url, tag)
    elif backend == "redis":
        target = Target(backend, args.redis_url, tag)
    else:
        directory = Path(tempfile.mkdtemp(prefix=f"{tag}_"))
        target = Target(backend, f"sqlite:///{directory / 'conveyor.db'}")
    app = target.app()
    try:
        async with app:
            await app.migrate_async()
            yield target, app
            await (await app.backend()).destroy()
    finally:
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)


async def drain(target: Target, app: App, args: argparse.Namespace) -> float:
    """Seconds one burst worker process takes to run everything due."""
    spec = WorkerSpec(target.url, args.concurrency, True, None, "warning")
    started = time.perf_counter()
    worker = start_worker(target, app, spec)
    status = await worker.wait(args.timeout)
    seconds = time.perf_counter() - started
    if status != 0:
        raise RuntimeError(f"the worker exited with {status}")
    return seconds


async def all_succeeded(app: App, ids: Sequence[int]) -> bool:
    counts = {c.state: c.count for c in await app.count_tasks_async()}
    return counts.get(TaskState.SUCCEEDED, 0) == len(ids) and sum(counts.values()) == len(ids)


async def plain_rate(backend: str, args: argparse.Namespace) -> float:
    async with fresh(backend, args) as (target, app):
        payloads = [{"i": i} for i in range(args.tasks)]
        ids = [h.id for h in await app.enqueue_many_async(TASK_NAME, payloads)]
        seconds = await drain(target, app, args)
        if not await all_succeeded(app, ids):
            raise RuntimeError("not every plain task succeeded")
        return len(ids) / seconds


async def group_rate(backend: str, args: argparse.Namespace) -> float:
    async with fresh(backend, args) as (target, app):
        noop = app.tasks[TASK_NAME]
        handle = await group(noop.s(i=i) for i in range(args.tasks)).enqueue_async()
        seconds = await drain(target, app, args)
        if not await all_succeeded(app, handle.ids):
            raise RuntimeError("not every member succeeded")
        return len(handle.ids) / seconds


async def callback_latency(backend: str, args: argparse.Namespace, result: Result) -> None:
    async with fresh(backend, args) as (target, app):
        noop, collect = app.tasks[TASK_NAME], app.tasks[COLLECT_NAME]
        spec = WorkerSpec(target.url, args.concurrency, False, None, "warning")
        worker = start_worker(target, app, spec)
        try:
            for n in range(args.chords):
                members = [noop.s(i=n * args.members + i) for i in range(args.members)]
                handle = await chord(members, collect.s().receiving("outcomes")).enqueue_async()
                if await handle.result_async(timeout=args.timeout) != args.members:
                    result.problems.append(f"chord {n}: the callback missed members")
                ends = [(await m.get_async()).finished_at for m in handle.group.members]
                callback = await handle.callback.get_async()
                if len(callback.attempts) != 1:
                    result.problems.append(f"chord {n}: the callback ran {callback.attempts}")
                last = max(e for e in ends if e is not None)
                started = callback.attempts[0].started_at
                result.callback_ms.append((started - last).total_seconds() * 1000)
        finally:
            await worker.stop()


async def run_backend(backend: str, args: argparse.Namespace) -> Result:
    result = Result(backend)
    try:
        for round_ in range(args.rounds):
            order = ("plain", "group") if round_ % 2 == 0 else ("group", "plain")
            rates: dict[str, float] = {}
            for kind in order:
                rate = await (plain_rate if kind == "plain" else group_rate)(backend, args)
                rates[kind] = rate
                log(f"[{backend}] round {round_ + 1}: {kind} {rate:,.0f} tasks/s")
            result.plain_per_s.append(rates["plain"])
            result.group_per_s.append(rates["group"])
            result.ratios.append(rates["group"] / rates["plain"])
        await callback_latency(backend, args, result)
    except Exception as exc:  # reported, and the exit status says so
        result.problems.append(f"{type(exc).__name__}: {exc}")
    return result


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def table(results: Sequence[Result]) -> str:
    lines = [
        "| backend | plain tasks/s | group members/s | group/plain | callback p50 ms | p99 ms |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        if r.problems:
            lines.append(f"| {r.backend} | failed: {'; '.join(r.problems)[:200]} | | | | |")
            continue
        lines.append(
            f"| {r.backend} | {statistics.median(r.plain_per_s):,.0f} "
            f"| {statistics.median(r.group_per_s):,.0f} | {r.ratio:.2f} "
            f"| {percentile(r.callback_ms, 0.5):.1f} | {percentile(r.callback_ms, 0.99):.1f} |"
        )
    return "\n".join(lines)


async def run(args: argparse.Namespace) -> int:
    results = [await run_backend(backend, args) for backend in args.backends]
    if args.json:
        print(json.dumps([{**asdict(r), "ratio": r.ratio} for r in results]))
    else:
        print(
            f"{args.tasks} tasks, {args.rounds} round(s), concurrency {args.concurrency}; "
            f"{args.chords} chords of {args.members}; load {os.getloadavg()[0]:.2f}"
        )
        print(table(results))
    return 1 if any(r.problems for r in results) else 0


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--backends",
        type=lambda text: [b.strip() for b in text.split(",") if b.strip()],
        default=["postgres", "sqlite", "redis"],
    )
    parser.add_argument("--url", default=os.environ.get("CONVEYOR_URL") or DEFAULT_URL)
    parser.add_argument("--redis-url", default=DEFAULT_REDIS_URL)
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--chords", type=int, default=100)
    parser.add_argument("--members", type=int, default=10)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--json", action="store_true")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    return asyncio.run(run(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
