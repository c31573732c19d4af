"""A quote that fans out, adds up, then waits for an approval: a coroutine task.

The "quote" coroutine spawns one plain "price" task per line item. Each
child's end message brings back its price; once every line is priced the
quote stores its subtotal and suspends: it holds no worker and no lease
while it waits. An approval then arrives from outside with ``app.send``, as
a webhook handler would send it, and the quote finishes with its total.

The state, the consumed messages and the spawns of each poll are written in
the same write that ends the poll: kill the worker at any point and a new
one goes on from the last committed poll, with the unread messages intact.

Run: python examples/coroutine_fanout.py      (SQLite in ./conveyor.db, or CONVEYOR_URL)
"""

from __future__ import annotations

import asyncio

import conveyor
from conveyor import Poll, TaskState

PRICES = {"book": 1250, "lamp": 3499, "mug": 675}  # cents

app = conveyor.App()


@app.task()
async def price(item: str, qty: int) -> int:
    return PRICES[item] * qty


@app.coroutine("quote")
async def quote(poll: Poll) -> conveyor.Sleep | conveyor.Suspend | conveyor.Done:
    state = poll.state
    if not state["started"]:  # the first poll: fan out, one child per line
        print(f"quote {state['quote']}: pricing {len(state['lines'])} lines")
        for item, qty in state["lines"].items():
            poll.spawn(price, args={"item": item, "qty": qty})
        state["started"] = True
    for message in poll.inbox:
        if message.is_end:  # a child ended: its result is the line's price
            end = message.body
            if end["state"] != "succeeded":
                return conveyor.done({"quote": state["quote"], "error": f"child {end['child']}"})
            state["priced"].append(end["result"])
        elif message.body.get("action") == "approve":  # from outside, any time
            state["approved_by"] = message.body["by"]
    if len(state["priced"]) < len(state["lines"]):
        return conveyor.suspend()  # until the next child ends
    if state.get("subtotal") is None:
        state["subtotal"] = sum(state["priced"])
        lines = ", ".join(f"{item} x{qty}" for item, qty in sorted(state["lines"].items()))
        print(f"quote {state['quote']}: priced {lines}: subtotal {_money(state['subtotal'])}")
    if "approved_by" not in state:
        print(f"quote {state['quote']}: waiting for approval")
        return conveyor.suspend()  # until someone approves
    print(f"quote {state['quote']}: approved by {state['approved_by']}")
    return conveyor.done({"quote": state["quote"], "total_cents": state["subtotal"]})


def _money(cents: int) -> str:
    return f"{cents // 100}.{cents % 100:02d}"


async def wait_until_priced(handle: conveyor.TaskHandle, timeout: float = 60) -> None:
    """Until the quote waits for its approval (what a review page would show)."""
    for _ in range(int(timeout / 0.05)):
        task = await handle.get_async()
        if task.state is TaskState.WAITING and task.payload.get("subtotal") is not None:
            return
        await asyncio.sleep(0.05)
    raise TimeoutError("the quote was not priced in time")


async def main() -> None:
    async with app:
        handle = await quote.start_async(
            {
                "quote": 7,
                "lines": {"book": 2, "lamp": 1, "mug": 4},
                "started": False,
                "priced": [],
            }
        )
        worker = app.worker(poll_interval=0.1, handle_signals=False)
        running = asyncio.create_task(worker.run())
        try:
            await wait_until_priced(handle)
            print("webhook: alice approves quote 7")
            await app.send_async(handle.id, {"action": "approve", "by": "alice"})
            print("result:", await handle.result_async(timeout=60))
        finally:
            worker.request_stop()
            await running
        children = await app.list_tasks_async(name="price")
        mine = sorted((t for t in children if t.parent_id == handle.id), key=lambda t: t.id)
        lines = [f"{t.payload['item']}={t.result}:{t.state.value}" for t in mine]
        print("children:", ", ".join(lines))


if __name__ == "__main__":
    asyncio.run(main())
