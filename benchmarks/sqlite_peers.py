"""conveyor on SQLite next to its Python peers on SQLite, one table.

The peers: huey (``SqliteHuey``) and DBOS (its durable queues, on a SQLite
system database). The workload, the columns and the rounds are those of
``peers.py`` (its machinery runs here: enqueue/s, processed/s with one and
two worker processes from each system's own records, e2e/s,
enqueue-to-start latency from the handlers' stamps, conveyor/best), each
system configured as its module under ``systems/`` says.

Every phase of every system gets a new SQLite file of its own,
``bench_<system>_<token>_<phase>.db``, in one directory (``--workdir``, by
default a new temporary one; it must be on a real disk, since the fsyncs
are part of what is measured). A system's files (the database, its
``-wal``, ``-shm`` or ``-journal``, and the handlers' record file) are
deleted after the round and the directory at the end; ``--keep`` keeps
them all.

Each system writes durably, as far as it has a choice: conveyor with its
defaults (WAL, ``synchronous=full``: every commit fsynced; its
``?synchronous=normal`` is not used), huey with ``fsync=True``
(``synchronous=FULL``; a dequeued task is deleted before it runs, so huey
loses the tasks of a killed consumer whatever the setting), DBOS with its
only settings (a rollback journal, SQLite's default ``synchronous=FULL``).

    pip install -e '.[dev,sqlite-peers]'
    python benchmarks/sqlite_peers.py --tasks 20000 --rounds 3
    python benchmarks/sqlite_peers.py --tasks 2000 --rate 50 --duration 4    # quick
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import shutil
import sqlite3
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(ROOT))

from benchmarks import peers  # noqa: E402
from benchmarks import throughput as tp  # noqa: E402

SQLITE_SYSTEMS: peers.Registry = {
    "conveyor": ("benchmarks.systems.conveyor_sqlite_peer", "ConveyorSqlite"),
    "huey": ("benchmarks.systems.huey_peer", "HueySystem"),
    "dbos": ("benchmarks.systems.dbos_peer", "DbosSystem"),
}


class SqliteStores:
    """A new file per store, ``NAME.db`` in ``folder``; dropping it deletes
    every file of the store (``NAME.*``: journal, WAL, shared memory, records)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder.resolve()  # the workers run in another directory

    async def create(self, name: str) -> str:
        path = self.folder / f"{name}.db"
        if path.exists():
            raise FileExistsError(path)
        return f"sqlite:///{path}"  # an absolute path: sqlite:////...

    async def drop(self, name: str) -> None:
        for path in self.folder.glob(f"{name}.*"):
            path.unlink(missing_ok=True)


def filesystem(folder: Path) -> str:
    """The type of the filesystem ``folder`` is on (Linux), or ``unknown``."""
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return "unknown"
    found, longest = "unknown", -1
    target = str(folder.resolve())
    for mount in mounts:
        _device, point, kind, *_ = mount.split()
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) > longest:
            found, longest = kind, len(point)
    return found


async def run(args: argparse.Namespace) -> int:
    args.token = secrets.token_hex(4)
    args.registry = SQLITE_SYSTEMS
    folder = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="bench_sqlite_"))
    folder.mkdir(parents=True, exist_ok=True)
    args.stores = SqliteStores(folder)
    environment = {
        "sqlite": sqlite3.sqlite_version,
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "workdir": str(folder),
        "filesystem": filesystem(folder),
    }
    report: dict[str, Any] = {"environment": environment, "parameters": vars_of(args)}
    try:
        results, rounds = await peers.run_rounds(args)
    finally:
        if args.keep:
            tp.log(f"kept the SQLite files in {folder}")
        elif not args.workdir:
            shutil.rmtree(folder, ignore_errors=True)
    report["rounds"] = [[asdict(r) for r in one] for one in rounds]
    report["results"] = [asdict(r) for r in results]
    text = (
        f"SQLite {environment['sqlite']} (files on {environment['filesystem']}), "
        f"Python {environment['python']}, {environment['cpus']} CPUs; {peers.workload(args)}\n"
        + peers.table(results, None, rounds)
    )
    return peers.report_out(args, report, text, results)


def vars_of(args: argparse.Namespace) -> dict[str, Any]:
    keys = ("tasks", "systems", "rate", "duration", "concurrency", "rounds")
    return {k: getattr(args, k) for k in keys}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="conveyor on SQLite next to huey and DBOS.")
    peers.add_workload_arguments(parser, SQLITE_SYSTEMS)
    parser.add_argument(
        "--workdir",
        help="the directory of the SQLite files (default: a new temporary one, removed at "
        "the end unless --keep); on a real disk, not tmpfs",
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(asyncio.run(run(parse_args())))
