"""conveyor next to its Python peers (PgQueuer, Procrastinate, Chancy), one table.

The same workload, one system after the other in one invocation, each in a
fresh database of its own on the same PostgreSQL server:

1. Enqueue ``--tasks`` no-op tasks in bulk, the way each system's docs say
   (timed: enqueue/s).
2. Drain them with ONE worker process, then (after a fresh enqueue into a
   fresh database) with TWO (``--processes`` names other counts, such as
   ``1,2,4``: a drain and a pair of columns each). processed/s = tasks / (first start to last
   finish, from the system's own tables); the wall time from spawning the
   processes to every task completed (interpreter start-up included) is the
   ``e2e`` figure. Each drain is checked: the system's tables must count all
   ``--tasks`` tasks succeeded, or the row says so.
3. Latency: one idle worker; one task at a time at ``--rate`` per second for
   ``--duration`` seconds. Each handler appends its start time next to the
   enqueue time carried in its payload (``stamp.py``); p50/p99 in ms.

With ``--rounds N`` all of it runs N times and the table shows each
figure's median. Within a round the phases go one at a time, each on every
system in turn (the order reversed every other round), so the machine's
slow minutes spread over the systems.

Then a ceiling: pgbench runs ``systems/ceiling.sql`` (claim 100 rows with FOR
UPDATE SKIP LOCKED and mark them done, one transaction) with 2 clients for
``--ceiling-seconds``: rows/s = tps x 100.

    pip install -e '.[dev,peers]'
    python benchmarks/peers.py --tasks 20000 --systems conveyor,pgqueuer,procrastinate,chancy \\
        --rate 200 --duration 20 [--json] [--keep]

How each peer is configured, and why, is in its module under ``systems/``.
``conveyor_observed`` is conveyor with an event callback, Prometheus
metrics and OpenTelemetry traces on (``bench_app.observe``): run it next to
``conveyor`` to see what watching costs.
``redis_peers.py`` runs the same rounds and table on Redis (conveyor next to
SAQ, arq, Dramatiq, taskiq, RQ and Celery): the stores (``Stores``) and the
systems (``Registry``) are what differ.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import importlib
import json
import math
import re
import secrets
import shutil
import statistics
import subprocess
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

from psycopg import sql

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(ROOT))

from benchmarks import throughput as tp  # noqa: E402
from benchmarks.bench_app import DEFAULT_URL  # noqa: E402

SYSTEMS = {
    "conveyor": ("benchmarks.systems.conveyor_peer", "Conveyor"),
    "conveyor_observed": ("benchmarks.systems.conveyor_peer", "ConveyorObserved"),
    "pgqueuer": ("benchmarks.systems.pgqueuer_peer", "PgQueuerSystem"),
    "procrastinate": ("benchmarks.systems.procrastinate_peer", "Procrastinate"),
    "chancy": ("benchmarks.systems.chancy_peer", "ChancySystem"),
}
CEILING_SCRIPT = ROOT / "benchmarks" / "systems" / "ceiling.sql"
CEILING_BATCH = 100
"""Rows the ceiling script claims per transaction."""
CEILING_HEADROOM = 150_000
"""Queued rows per second of the ceiling run, so the table cannot run dry."""


# -- results -------------------------------------------------------------------


@dataclass
class Result:
    system: str
    note: str = ""
    enqueue_per_s: float | None = None
    processed: dict[int, float] = field(default_factory=dict)
    """processed/s by worker processes"""
    e2e: dict[int, float] = field(default_factory=dict)
    """tasks over the wall time from spawning the processes, by processes"""
    latency_p50_ms: float | None = None
    latency_p99_ms: float | None = None
    latency_sent: int = 0
    latency_started: int = 0
    problems: list[str] = field(default_factory=list)
    databases: list[str] = field(default_factory=list)
    drains: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass
class Ceiling:
    seconds: float
    clients: int
    tps: float
    rows_per_s: float
    rows_left: int
    """Still queued after the run: 0 means it ran dry and the figure is low."""
    database: str


# -- databases -----------------------------------------------------------------


def database_url(url: str, name: str) -> str:
    """``url`` pointing at database ``name`` on the same server."""
    return urlunsplit(urlsplit(tp.libpq_url(url))._replace(path=f"/{name}"))


async def create_database(url: str, name: str) -> str:
    async with tp.connect(url) as conn:
        await conn.execute(sql.SQL("create database {}").format(sql.Identifier(name)))
    return database_url(url, name)


async def drop_database(url: str, name: str) -> None:
    async with tp.connect(url) as conn:
        query = "drop database if exists {} with (force)"
        await conn.execute(sql.SQL(query).format(sql.Identifier(name)))


class Stores(Protocol):
    """Where each phase of each system gets a fresh, empty store of its own."""

    async def create(self, name: str) -> str:
        """A new empty store called ``name``; the URL its system is given."""
        ...

    async def drop(self, name: str) -> None:
        """Remove store ``name`` (after the round, unless ``--keep``)."""
        ...


@dataclass(frozen=True)
class PostgresStores:
    """A fresh database per store, beside the database of ``url``."""

    url: str

    async def create(self, name: str) -> str:
        return await create_database(self.url, name)

    async def drop(self, name: str) -> None:
        await drop_database(self.url, name)


# -- one system ----------------------------------------------------------------


Registry = Mapping[str, tuple[str, str]]
"""System name -> (module, class): ``SYSTEMS`` here, ``REDIS_SYSTEMS`` in redis_peers.py."""


def load_system(name: str, registry: Registry = SYSTEMS) -> Callable[[int, str], Any]:
    module_name, class_name = registry[name]
    cls: Callable[[int, str], Any] = getattr(importlib.import_module(module_name), class_name)
    return cls


async def fresh(args: argparse.Namespace, result: Result, phase: str, make: Any) -> Any:
    name = f"bench_{result.system}_{args.token}_{phase}"
    dsn = await args.stores.create(name)
    result.databases.append(name)
    system = make()
    await system.setup(dsn)
    return system


async def throughput(args: argparse.Namespace, result: Result, make: Any, procs: int) -> None:
    system = await fresh(args, result, f"{procs}p", make)
    try:
        if args.release:
            run, enqueue_seconds = await system.drain_released(procs, args.tasks, args.timeout)
        else:
            enqueue_seconds = await system.enqueue(args.tasks)
        tp.log(f"[{result.system}] enqueued {args.tasks} in {enqueue_seconds:.2f}s; {procs} proc")
        if not args.release:
            run = await system.drain(procs, args.tasks, args.timeout)
    finally:
        await system.teardown()
    done = run.completion
    window = done.window()
    # Both drains begin with a bulk enqueue of the same tasks: the rate is
    # taken over both, so one hiccup of the machine in a call of a fifth of
    # a second does not make the column.
    enqueued = [d["enqueue_seconds"] for d in result.drains] + [enqueue_seconds]
    result.enqueue_per_s = args.tasks * len(enqueued) / sum(enqueued)
    if window > 0:
        result.processed[procs] = args.tasks / window
    result.e2e[procs] = done.succeeded / run.wall_seconds
    result.drains.append({**asdict(run), "enqueue_seconds": enqueue_seconds})
    if done.succeeded != args.tasks or done.unfinished:
        result.problems.append(
            f"{procs} proc: {done.succeeded} of {args.tasks} succeeded, "
            f"{done.unfinished} unfinished{' (timed out)' if run.timed_out else ''}"
        )


async def latency(args: argparse.Namespace, result: Result, make: Any) -> None:
    system = await fresh(args, result, "lat", make)
    try:
        seconds = await system.latency(args.rate, args.duration, args.timeout)
    finally:
        await system.teardown()
    result.latency_sent = max(1, round(args.rate * args.duration))
    result.latency_started = len(seconds)
    if seconds:
        result.latency_p50_ms = 1000 * tp.quantile(seconds, 0.5)
        result.latency_p99_ms = 1000 * tp.quantile(seconds, 0.99)
    if len(seconds) != result.latency_sent:
        result.problems.append(f"latency: {len(seconds)} of {result.latency_sent} started")


Phase = Callable[[argparse.Namespace, Result, Any], Awaitable[None]]


def phases(processes: Sequence[int]) -> list[tuple[str, Phase]]:
    """A round's phases: a drain per count of worker processes, then the
    latency. Each phase runs on every system in turn before the next phase
    starts, so a slow minute of a shared machine falls on one phase of every
    system rather than on every phase of one."""
    drains: list[tuple[str, Phase]] = [
        (f"{n} proc", functools.partial(throughput, procs=n)) for n in processes
    ]
    return [*drains, ("latency", latency)]


async def run_round(args: argparse.Namespace, names: Sequence[str], number: int) -> list[Result]:
    """One round: every phase on every system, phase by phase; the systems
    take turns in the given order in even rounds and reversed in odd ones.
    ``args.registry`` names the systems, ``args.stores`` makes their stores."""
    results = {name: Result(name) for name in names}
    makers: dict[str, Callable[[], Any]] = {}
    for name in names:
        try:
            cls = load_system(name, args.registry)
        except ImportError as error:
            results[name].problems.append(f"not installed ({error}); see benchmarks/README.md")
            continue
        concurrency = args.concurrency.get(name, cls.default_concurrency)  # type: ignore[attr-defined]
        makers[name] = functools.partial(cls, concurrency, args.worker_log_level)
        results[name].note = makers[name]().note
    order = list(names) if number % 2 == 0 else list(reversed(names))
    failed: set[str] = set()
    try:
        for label, phase in phases(args.processes):
            for name in order:
                if name not in makers or name in failed:
                    continue
                try:
                    await phase(args, results[name], makers[name])
                except Exception as error:  # report it in the table, go on with the rest
                    tp.log(f"[{name}] {label} failed: {error!r}")
                    results[name].problems.append(f"{label} failed: {error!r}")
                    failed.add(name)
    finally:
        if not args.keep:
            for result in results.values():
                for database in result.databases:
                    await args.stores.drop(database)
    return [results[name] for name in names]


MEDIAN_FIELDS = ("enqueue_per_s", "latency_p50_ms", "latency_p99_ms")


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def median(rounds: list[Result]) -> Result:
    """One system's rounds as one row: the median of each figure (the
    systems take turns, so a slow spell of the machine hits each of them);
    every round's problems, databases and drains."""
    merged = Result(rounds[0].system, rounds[0].note)
    for name in MEDIAN_FIELDS:
        setattr(merged, name, _median([getattr(r, name) for r in rounds]))
    for by in ("processed", "e2e"):
        counts = sorted({n for r in rounds for n in getattr(r, by)})
        for n in counts:
            value = _median([getattr(r, by).get(n) for r in rounds])
            if value is not None:
                getattr(merged, by)[n] = value
    merged.latency_sent = sum(r.latency_sent for r in rounds)
    merged.latency_started = sum(r.latency_started for r in rounds)
    for r in rounds:
        merged.problems += r.problems
        merged.databases += r.databases
        merged.drains += r.drains
    return merged


# -- the pgbench ceiling -------------------------------------------------------


async def ceiling(args: argparse.Namespace) -> Ceiling:
    """pgbench's batched SKIP LOCKED claim on a bare table: the machine's limit."""
    from benchmarks.systems.system import QUERIES

    pgbench = shutil.which("pgbench")
    if pgbench is None:
        raise RuntimeError("pgbench is not on PATH (apt-get install postgresql-client)")
    name = f"bench_ceiling_{args.token}"
    dsn = await create_database(args.url, name)
    try:
        rows = max(args.tasks, math.ceil(CEILING_HEADROOM * args.ceiling_seconds))
        async with tp.connect(dsn) as conn:
            await conn.execute(QUERIES["ceiling_table"])
            await conn.execute(QUERIES["ceiling_index"])
            await conn.execute(QUERIES["ceiling_fill"], {"rows": rows})
            await conn.execute("vacuum analyze jobs")
        command = [pgbench, "-n", "-f", str(CEILING_SCRIPT), "-c", "2", "-j", "2"]
        command += ["-T", str(max(1, round(args.ceiling_seconds))), dsn]
        tp.log(f"[ceiling] {rows} rows; {' '.join(command[:-1])} {name}")
        out = await asyncio.to_thread(
            subprocess.run, command, capture_output=True, text=True, check=True
        )
        match = re.search(r"^tps = ([\d.]+)", out.stdout, re.MULTILINE)
        if match is None:
            raise RuntimeError(f"no tps in pgbench's output:\n{out.stdout}{out.stderr}")
        async with tp.connect(dsn) as conn:
            left, _done = await tp.fetch_one(conn, QUERIES["ceiling_left"])
    finally:
        if not args.keep:
            await drop_database(args.url, name)
    tps = float(match.group(1))
    return Ceiling(args.ceiling_seconds, 2, tps, tps * CEILING_BATCH, left, name)


# -- the table -----------------------------------------------------------------


def _rate(value: float | None) -> str:
    return f"{value:,.0f}" if value is not None else "-"


def _ms(value: float | None) -> str:
    return f"{value:.1f}" if value is not None else "-"


@dataclass(frozen=True)
class Column:
    header: str
    get: Callable[[Result], float | None]
    format: Callable[[float | None], str]
    higher: bool
    """True if a higher figure is the better one."""


def columns(results: Sequence[Result]) -> list[Column]:
    """The table's columns: enqueue/s, processed/s and e2e/s for each count
    of worker processes drained in ``results``, the latency."""
    counts = sorted({n for r in results for n in (*r.processed, *r.e2e)}) or [1, 2]
    return [
        Column("enqueue/s", lambda r: r.enqueue_per_s, _rate, True),
        *(
            Column(f"processed/s {n}p", functools.partial(_by, "processed", n), _rate, True)
            for n in counts
        ),
        *(Column(f"e2e/s {n}p", functools.partial(_by, "e2e", n), _rate, True) for n in counts),
        Column("p50 ms", lambda r: r.latency_p50_ms, _ms, False),
        Column("p99 ms", lambda r: r.latency_p99_ms, _ms, False),
    ]


def _by(attribute: str, processes: int, result: Result) -> float | None:
    figures: dict[int, float] = getattr(result, attribute)
    return figures.get(processes)


def ratio_values(
    results: Sequence[Result], reference: str | None = None, shown: Sequence[Column] = ()
) -> list[float | None]:
    """conveyor's value over the best peer's (or over system ``reference``'s),
    per column (None if either is missing); a row of conveyor on another
    store (``conveyor-pg``) is no peer."""
    ours = next((r for r in results if r.system == "conveyor"), None)
    found: list[float | None] = []
    for column in shown or columns(results):
        peers = [
            column.get(r)
            for r in results
            if (r.system == reference if reference else not r.system.startswith("conveyor"))
        ]
        values = [v for v in peers if v]
        mine = column.get(ours) if ours else None
        if not values or not mine:
            found.append(None)
            continue
        found.append(mine / (max(values) if column.higher else min(values)))
    return found


def ratio_cells(values: Sequence[float | None]) -> list[str]:
    return ["-" if v is None else f"{v:.2f}x" for v in values]


def round_ratios(rounds: Sequence[Sequence[Result]], shown: Sequence[Column]) -> list[str]:
    """Per column, the median over the rounds of each round's conveyor/best:
    each round's systems ran side by side, so the ratio within a round is
    less exposed to the machine's drift than a ratio of medians."""
    per_round = [ratio_values(one, shown=shown) for one in rounds]
    return ratio_cells([_median(column) for column in zip(*per_round, strict=True)])


def line(first: str, cells: Sequence[str], shown: Sequence[Column]) -> str:
    """A row of the table: a label, then a cell per column."""
    widths = [max(len(c.header), 9) for c in shown]
    return f"{first:<14}" + "".join(f" {c:>{w}}" for c, w in zip(cells, widths, strict=True))


def table(
    results: Sequence[Result], top: Ceiling | None, rounds: Sequence[Sequence[Result]] = ()
) -> str:
    shown = columns(results)
    header = line("system", [c.header for c in shown], shown)
    header += f" {'% ceiling':>9} {'check':>6}  config"
    lines = [header, "-" * len(header)]
    for r in results:
        share = "-"
        most = max(r.processed, default=None)
        if top is not None and most is not None:
            share = f"{100 * r.processed[most] / top.rows_per_s:.0f}%"
        row = line(r.system, [c.format(c.get(r)) for c in shown], shown)
        lines.append(row + f" {share:>9} {'ok' if r.ok else 'FAIL':>6}  {r.note}")
    if len(results) > 1:
        lines.append(line("conveyor/best", ratio_cells(ratio_values(results, shown=shown)), shown))
        if len(rounds) > 1:
            lines.append(line("  per round", round_ratios(rounds, shown), shown))
    if top is not None:
        dry = "" if top.rows_left else "  (ran dry: a lower bound)"
        lines.append(
            f"ceiling: pgbench, {CEILING_BATCH}-row FOR UPDATE SKIP LOCKED claim + mark done per "
            f"transaction, {top.clients} clients, {top.seconds:g}s: "
            f"{top.tps:,.0f} tps = {top.rows_per_s:,.0f} rows/s{dry}"
        )
    return "\n".join(lines)


# -- main ----------------------------------------------------------------------


def systems_type(registry: Registry) -> Callable[[str], list[str]]:
    """An argparse type: a comma-separated list of names from ``registry``, in order."""

    def parse(text: str) -> list[str]:
        names = [part.strip() for part in text.split(",") if part.strip()]
        unknown = sorted(set(names) - set(registry))
        if unknown or not names:
            raise argparse.ArgumentTypeError(f"choose from {','.join(registry)}; not {unknown}")
        return names

    return parse


def processes_type(text: str) -> list[int]:
    """An argparse type: counts of worker processes, like ``1,2,4``."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts or not all(p.isdigit() and 1 <= int(p) <= 64 for p in parts):
        raise argparse.ArgumentTypeError(f"expected counts from 1 to 64, like 1,2,4: {text!r}")
    return sorted({int(p) for p in parts})


def concurrency_type(registry: Registry) -> Callable[[str], dict[str, int]]:
    """An argparse type: ``system=N,...`` per-system concurrency overrides."""

    def parse(text: str) -> dict[str, int]:
        chosen: dict[str, int] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            name, _, value = part.partition("=")
            if name not in registry or not value.isdigit() or int(value) < 1:
                raise argparse.ArgumentTypeError(f"expected system=N, like conveyor=100: {part!r}")
            chosen[name] = int(value)
        return chosen

    return parse


async def run_rounds(args: argparse.Namespace) -> tuple[list[Result], list[list[Result]]]:
    """``args.rounds`` rounds of every system (``args.systems``): the median
    row of each system, and every round's rows."""
    token = args.token
    rounds: list[list[Result]] = []
    for number in range(args.rounds):
        args.token = f"{token}r{number}" if args.rounds > 1 else token
        rounds.append(await run_round(args, args.systems, number))
        if args.rounds > 1:
            tp.log(f"round {number + 1} of {args.rounds}:\n{table(rounds[-1], None)}")
    args.token = token
    return [median(list(each)) for each in zip(*rounds, strict=True)], rounds


def report_out(
    args: argparse.Namespace, report: dict[str, Any], text: str, results: Sequence[Result]
) -> int:
    """Print the table (or the JSON report); the exit status: 0 if every check passed."""
    for r in results:
        for problem in r.problems:
            tp.log(f"{r.system}: {problem}")
    if args.keep:
        tp.log("kept stores: " + ", ".join(d for r in results for d in r.databases))
    if args.json:
        tp.log(text)
        print(json.dumps(report, indent=2, default=str))
    else:
        print(text)
    return 0 if all(r.ok for r in results) else 1


async def run(args: argparse.Namespace) -> int:
    args.token = secrets.token_hex(4)
    args.registry = SYSTEMS
    args.stores = PostgresStores(args.url)
    report: dict[str, Any] = {"environment": await tp.environment(args.url)}
    report["parameters"] = {
        k: getattr(args, k)
        for k in (
            "tasks",
            "systems",
            "processes",
            "rate",
            "duration",
            "concurrency",
            "ceiling_seconds",
        )
    }
    results, rounds = await run_rounds(args)
    report["rounds"] = [[asdict(r) for r in one] for one in rounds]
    top = await ceiling(args) if args.ceiling_seconds > 0 else None
    report["results"] = [asdict(r) for r in results]
    report["ceiling"] = asdict(top) if top else None
    env = report["environment"]
    text = (
        f"PostgreSQL {env['postgresql']} (synchronous_commit={env['synchronous_commit']}), "
        f"Python {env['python']}, {env['cpus']} CPUs; {workload(args)}\n"
        + table(results, top, rounds)
    )
    return report_out(args, report, text, results)


def workload(args: argparse.Namespace) -> str:
    """The workload in a table's heading: tasks, latency rate and rounds."""
    rounds = f"; medians of {args.rounds} rounds" if args.rounds > 1 else ""
    return f"{args.tasks} no-op tasks; latency {args.rate:g}/s for {args.duration:g}s{rounds}"


def add_workload_arguments(parser: argparse.ArgumentParser, registry: Registry) -> None:
    """The options both benchmarks share: the workload, the systems, the rounds."""
    parser.add_argument("--tasks", type=tp.positive_int, default=20_000, help="tasks per drain")
    parser.add_argument(
        "--systems",
        type=systems_type(registry),
        default=list(registry),
        help="comma-separated, in order",
    )
    parser.add_argument("--keep", action="store_true", help="keep the benchmark stores")
    parser.add_argument("--json", action="store_true", help="JSON on stdout, the table on stderr")
    parser.add_argument(
        "--concurrency",
        type=concurrency_type(registry),
        default={},
        help="per-system override, e.g. conveyor=100,pgqueuer=200 (pgqueuer: its batch size)",
    )
    parser.add_argument("--rate", type=tp.positive_float, default=200.0, help="latency: tasks/s")
    parser.add_argument(
        "--duration", type=tp.positive_float, default=20.0, help="latency: seconds of enqueueing"
    )
    parser.add_argument(
        "--timeout", type=tp.positive_float, default=600.0, help="seconds per phase"
    )
    parser.add_argument("--worker-log-level", default="WARNING", help="the workers' log level")
    parser.add_argument(
        "--processes",
        type=processes_type,
        default=[1, 2],
        help="worker processes of each drain, comma-separated (default 1,2)",
    )
    parser.add_argument(
        "--rounds",
        type=tp.positive_int,
        default=1,
        help="run every system this many times, taking turns; the table shows medians",
    )
    parser.add_argument(
        "--release",
        action="store_true",
        help="start the drains' workers first, stop them while the tasks are enqueued,"
        " and release them together (processed/s and e2e/s then count from the release)",
    )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="conveyor next to PgQueuer, Procrastinate and Chancy, one table."
    )
    parser.add_argument(
        "--url",
        default=DEFAULT_URL,
        help="any database on the PostgreSQL server; each system gets fresh ones beside it "
        "(default %(default)s)",
    )
    add_workload_arguments(parser, SYSTEMS)
    parser.add_argument(
        "--ceiling-seconds", type=float, default=10.0, help="pgbench run length; 0 skips it"
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(asyncio.run(run(parse_args())))
