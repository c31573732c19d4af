"""``python -m tools.chaos``: run chaos scenarios against a backend and check them.

    python -m tools.chaos --backend postgres --scenario kill            # smoke profile
    python -m tools.chaos --backend sqlite --scenario all --profile soak
    python -m tools.chaos --backend redis --scenario wipe               # data loss

``wipe`` (Redis only, not part of ``all``) restarts a server without
persistence empty under running workers (:mod:`tools.chaos.wipe`).

Each run uses a fresh store (a throwaway PostgreSQL schema, a new SQLite file,
a Redis server of its own with ``appendfsync always``)
and a work directory holding the ledger, the faults file, the worker logs and
``report.json``. Prints a one-screen summary per run; exits 1 on any breach.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import tempfile
import uuid
from dataclasses import replace
from pathlib import Path

from tools.chaos.harness import SCENARIOS, SERVER_ONLY, SMOKE, SOAK, redis_store, run
from tools.chaos.wipe import forgetful_store, run_wipe
from tools.redis_server import RedisServer

PG_URL = "postgresql://127.0.0.1:5432/test"


def store(backend: str, workdir: Path, url: str) -> tuple[str, str | None, RedisServer | None]:
    """A fresh store: its URL, schema (or Redis key prefix), and Redis server."""
    if backend == "sqlite":
        return f"sqlite:///{workdir / 'chaos.db'}", None, None
    if backend == "redis":
        server = redis_store(workdir)
        return server.url, "chaos", server
    return url, f"chaos_{uuid.uuid4().hex[:8]}", None


async def main(args: argparse.Namespace) -> int:
    # The harness's own pool reports every connection a fault broke; the
    # summary says what matters.
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
    profile = {"smoke": SMOKE, "soak": SOAK}[args.profile]
    if args.tasks is not None:
        profile = replace(profile, tasks=args.tasks)
    if args.fault_seconds is not None:
        profile = replace(profile, fault_seconds=args.fault_seconds)
    scenarios = list(SCENARIOS) if args.scenario == "all" else [args.scenario]
    if args.backend == "sqlite":  # no network, no server to restart
        scenarios = [s for s in scenarios if s not in SERVER_ONLY]
    root = Path(args.workdir or tempfile.mkdtemp(prefix="conveyor-chaos-"))
    if args.scenario == "wipe":
        return await wipe(args.backend, root / "redis-wipe", args.seed)
    failed = False
    for scenario in scenarios:
        workdir = root / f"{args.backend}-{scenario}"
        workdir.mkdir(parents=True, exist_ok=True)
        url, schema, server = store(args.backend, workdir, args.url)
        try:
            report = await run(
                url,
                scenario,
                workdir,
                profile,
                schema=schema,
                seed=args.seed,
                log=print,
                redis=server,
            )
        finally:
            if server is not None:
                server.stop()
        print(f"== {args.backend} / {scenario} ({workdir})")
        print(report.summary())
        failed |= not report.ok
    return 1 if failed else 0


async def wipe(backend: str, workdir: Path, seed: int) -> int:
    """The ``wipe`` run, on a Redis server of its own without persistence."""
    if backend != "redis":
        print("the wipe run needs --backend redis")
        return 2
    await asyncio.to_thread(workdir.mkdir, parents=True, exist_ok=True)
    server = forgetful_store(workdir)
    try:
        report = await run_wipe(server, workdir / "run", seed=seed)
    finally:
        server.stop()
    print(f"== redis / wipe ({workdir})")
    print(report.summary())
    return 0 if report.ok else 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tools.chaos", description=__doc__)
    parser.add_argument("--backend", choices=("postgres", "sqlite", "redis"), default="postgres")
    parser.add_argument("--scenario", choices=(*SCENARIOS, "wipe", "all"), default="all")
    parser.add_argument("--profile", choices=("smoke", "soak"), default="smoke")
    parser.add_argument("--url", default=PG_URL, help="PostgreSQL URL (default %(default)s)")
    parser.add_argument("--workdir", help="where runs keep their files (default: a temp dir)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tasks", type=int, help="override the profile's task count")
    parser.add_argument(
        "--fault-seconds", type=float, help="override the profile's longest fault window"
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args())))
