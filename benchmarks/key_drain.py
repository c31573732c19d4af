"""How long one worker takes to drain the tasks of one concurrency key.

``--tasks`` tasks of one key (limit ``--limit``), each sleeping ``--sleep``
seconds, drained by one in-process worker of ``--concurrency`` slots with
its default poll interval (``--poll`` to change it). The ideal is about
tasks / limit x sleep; a key whose freed slot waits for the next poll
takes about tasks / limit x poll instead. Prints the seconds from the
worker's start to the last task's end.

    python benchmarks/key_drain.py postgresql://127.0.0.1:5432/test
    python benchmarks/key_drain.py sqlite:////tmp/key_drain.db
    python benchmarks/key_drain.py redis://127.0.0.1:6379/0

Run it with ``PYTHONPATH=<tree>/src`` to measure another tree's code. On
PostgreSQL and Redis it works in a schema (key prefix) of its own, dropped
at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid

import conveyor
from conveyor import Concurrency


async def drain(url: str, tasks: int, limit: int, sleep: float, slots: int, poll: float) -> float:
    schema = f"key_drain_{uuid.uuid4().hex[:8]}"
    options = {} if url.startswith(("sqlite:", "memory:")) else {"schema": schema}
    app = conveyor.App(url, **options)

    @app.task(concurrency=Concurrency(key="one", limit=limit))
    async def keyed(n: int) -> None:
        await asyncio.sleep(sleep)

    config = {"concurrency": slots, "handle_signals": False}
    if poll > 0:
        config["poll_interval"] = poll
    async with app:
        ids = [(await keyed.enqueue_async(n=n)).id for n in range(tasks)]
        worker = app.worker(**config)
        started = time.monotonic()
        running = asyncio.create_task(worker.run())
        while True:
            found = [await app.get_async(i) for i in ids]
            if all(t is not None and t.state.is_terminal for t in found):
                break
            await asyncio.sleep(0.01)
        seconds = time.monotonic() - started
        worker.request_stop(immediate=True)
        await running
        backend = await app.backend()
        destroy = getattr(backend, "destroy", None)
        if destroy is not None and "schema" in options:
            await destroy()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url")
    parser.add_argument("--tasks", type=int, default=60)
    parser.add_argument("--limit", type=int, default=2)
    parser.add_argument("--sleep", type=float, default=0.1)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--poll", type=float, default=0, help="0: the worker's default")
    args = parser.parse_args()
    seconds = asyncio.run(
        drain(args.url, args.tasks, args.limit, args.sleep, args.concurrency, args.poll)
    )
    print(f"{args.url.split(':')[0]}: {args.tasks} tasks drained in {seconds:.1f}s")


if __name__ == "__main__":
    main()
