"""How fast the dashboard's task lists page with a million finished tasks.

Bulk-enqueues ``--tasks`` (default 1,000,000) tasks into a fresh PostgreSQL
schema (``App.enqueue_many_async``, COPY-fast), marks them all succeeded
(one UPDATE of ``dashboard_paging.sql``, then ANALYZE), and times the reads
the Tasks page makes, through the same API (``list_tasks_async``, 51 rows:
a page of 50 and one to know whether a next page exists):

- the first page, unfiltered;
- page 5000, reached by ``before`` (keyset: the id 5000 pages down);
- a filtered page: ``state=succeeded`` and ``name``, deep in the table;
- the overview's activity chart read (``Inspector.activity`` over the last hour);

each the median of ``--repeat`` runs, with the plan PostgreSQL chose
(``EXPLAIN ANALYZE``). The schema is dropped at the end.

    python3 benchmarks/dashboard_paging.py [--url postgresql://127.0.0.1:5432/test]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

import conveyor
from conveyor.backends import sqlfiles
from conveyor.records import ACTIVITY_SCAN

PAGE = 51
BLOCKS = sqlfiles.parse_blocks(Path(__file__).with_suffix(".sql").read_text(encoding="utf-8"))


async def timed(label: str, read: Callable[[], Awaitable[Any]], repeat: int) -> Any:
    found = None
    took = []
    for _ in range(repeat):
        started = time.perf_counter()
        found = await read()
        took.append((time.perf_counter() - started) * 1000)
    print(f"{label:<44} median {statistics.median(took):8.2f} ms   max {max(took):8.2f} ms")
    return found


def explain(url: str, schema: str, statement: bytes, args: dict[str, Any]) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        query = sql.SQL(BLOCKS["explain_prefix"]) + sql.SQL(" ") + sql.SQL(statement.decode())
        for (line,) in conn.execute(query, args):
            print("    " + line)


async def main(args: argparse.Namespace) -> None:
    schema = f"bench_{uuid.uuid4().hex[:8]}_paging"
    app = conveyor.App(args.url, schema=schema, allow_unregistered=True)
    try:
        await app.migrate_async()
        started = time.perf_counter()
        chunk = 100_000
        for first in range(0, args.tasks, chunk):
            size = min(chunk, args.tasks - first)
            name = "report" if first == 0 else "job"  # the filtered page's name: rare and old
            await app.enqueue_many_async(name, ({"n": first + n} for n in range(size)))
        with psycopg.connect(args.url, autocommit=True) as conn:
            finish = sql.SQL(BLOCKS["finish_all"]).format(schema=sql.Identifier(schema))
            conn.execute(finish)
            conn.execute(sql.SQL("analyze {}").format(sql.Identifier(schema, "tasks")))
        print(f"{args.tasks:,} succeeded tasks loaded in {time.perf_counter() - started:.1f} s")

        top = await app.list_tasks_async(limit=1)
        newest = top[0].id
        deep = newest - min(5000 * 50, newest // 2)  # page 5000 of 50 (half-way if fewer)
        first = await timed("first page", lambda: app.list_tasks_async(limit=PAGE), args.repeat)
        assert len(first) == PAGE
        page = await timed(
            "page 5000 (before=...)",
            lambda: app.list_tasks_async(limit=PAGE, before=deep),
            args.repeat,
        )
        assert page[0].id == deep - 1
        filtered = await timed(
            "state=succeeded name=report (rare, old)",
            lambda: app.list_tasks_async(state="succeeded", name="report", limit=PAGE),
            args.repeat,
        )
        assert len(filtered) == PAGE
        filtered_deep = await timed(
            "state=succeeded queue=default, page 5000",
            lambda: app.list_tasks_async(
                state="succeeded", queue="default", limit=PAGE, before=deep
            ),
            args.repeat,
        )
        assert filtered_deep[0].id == deep - 1
        now = await app.now_async()
        await timed(
            "activity, last hour (the overview's chart)",
            lambda: app.activity_async(now - timedelta(hours=1), 60),
            args.repeat,
        )

        backend = await app.backend()
        statements: Any = backend.sql  # type: ignore[attr-defined]
        base = {"state": None, "name": None, "queue": None, "limit": PAGE, "before": None}
        print("\nplans:")
        for label, params in (
            ("first page", base),
            ("page 5000", {**base, "before": deep}),
            ("state=succeeded name=report", {**base, "state": "succeeded", "name": "report"}),
        ):
            print(f"  {label}:")
            explain(args.url, schema, statements["list_tasks"], params)
        print("  activity, last hour:")
        explain(
            args.url,
            schema,
            statements["activity"],
            {"since": now - timedelta(hours=1), "bucket": 60, "scan": ACTIVITY_SCAN},
        )
    finally:
        await app.aclose()
        with psycopg.connect(args.url, autocommit=True) as conn:
            conn.execute(sql.SQL("drop schema if exists {} cascade").format(sql.Identifier(schema)))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="postgresql://127.0.0.1:5432/test")
    parser.add_argument("--tasks", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=7)
    asyncio.run(main(parser.parse_args()))
