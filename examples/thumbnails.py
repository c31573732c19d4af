"""Resize many images in parallel, then report once they have all ended: a chord.

The members run on any worker, in parallel; the callback waits for every
one of them (stored ``waiting``, holding no worker) and runs once, after the
last has ended, with each member's outcome in order: a failed member shows
up as a failure in the report instead of stopping it. The callback is made
due by the same write that ends the last member: no task polls for it.
A chain then runs two steps one after the other, the second receiving the
first's result.

Run: python examples/thumbnails.py      (SQLite in ./conveyor.db, or CONVEYOR_URL)
"""

from __future__ import annotations

import asyncio

import conveyor
from conveyor import chain, chord

app = conveyor.App()


@app.task()
async def resize(path: str) -> int:
    if path.endswith(".bmp"):
        raise conveyor.Fatal(f"cannot read {path}")
    return len(path) * 1000  # the thumbnail's size in bytes


@app.task()
async def report(outcomes: list[conveyor.TaskOutcome]) -> str:
    done = [o for o in outcomes if o.succeeded]
    failed = [o.error_message for o in outcomes if not o.succeeded]
    return f"{len(done)} resized ({sum(o.result for o in done)} bytes); failed: {failed}"


@app.task()
async def publish(size: int) -> str:
    return f"published {size} bytes"


async def start(paths: list[str]) -> conveyor.ChordHandle[int, str]:
    members = [resize.s(path=p) for p in paths]  # resize(path) once per image, in parallel
    summary = report.s().receiving("outcomes")  # report(outcomes) once, after the last ends
    return await chord(members, summary).enqueue_async()


async def main() -> None:
    async with app:
        handle = await start(["a.png", "b.jpg", "c.bmp", "d.gif"])
        one = await chain(resize.s(path="cover.png"), publish.s().receiving("size")).enqueue_async()
        worker = app.worker(poll_interval=0.1, handle_signals=False, concurrency=4)
        running = asyncio.create_task(worker.run())
        try:
            print("report:", await handle.result_async(timeout=60))
            print("chain:", await one.result_async(timeout=60))
        finally:
            worker.request_stop()
            await running


if __name__ == "__main__":
    asyncio.run(main())
