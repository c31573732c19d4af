"""Quickstart: enqueue a few tasks, run a worker until they are done, print results.

Run: CONVEYOR_URL=postgresql://127.0.0.1:5432/test python examples/quickstart.py
"""

from __future__ import annotations

import asyncio

import conveyor

app = conveyor.App()  # the URL comes from CONVEYOR_URL


@app.task(retry=conveyor.RetryPolicy(max_attempts=3, initial_interval=0.1))
async def greet(name: str) -> str:
    return f"hello, {name}"


@app.task()
def shout(text: str) -> str:  # a plain def runs in a thread
    return text.upper()


async def main() -> None:
    async with app:
        handles = [
            await greet.enqueue_async(name="world"),
            await shout.enqueue_async(text="durable"),
        ]
        worker = app.worker(burst=True, poll_interval=0.1, handle_signals=False)
        await worker.run()
        for handle in handles:
            print(await handle.result_async(timeout=5))


if __name__ == "__main__":
    asyncio.run(main())
