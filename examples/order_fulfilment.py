"""An order-fulfilment step workflow with a delayed reminder.

Reserve the stock, charge the card (retried on network faults), ship, then
one REMIND_AFTER seconds later ask for a review. Every transition is stored
before the next step runs: kill the worker at any point and a new one goes
on from the last committed step.

Run: python examples/order_fulfilment.py      (SQLite in ./conveyor.db, or CONVEYOR_URL)
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass

import conveyor
from conveyor import RetryPolicy, TaskContext

REMIND_AFTER = float(os.environ.get("REMIND_AFTER", "1.0"))

app = conveyor.App()
orders = app.workflow("order")


@orders.step
@dataclass
class Reserve:
    order_id: int
    items: list[str]

    async def run(self, ctx: TaskContext) -> conveyor.Next:
        print(f"order {self.order_id}: reserved {', '.join(self.items)}")
        return conveyor.next(Charge(self.order_id, cents=1999))


@orders.step(retry=RetryPolicy(max_attempts=5, initial_interval=0.1, jitter=0))
@dataclass
class Charge:
    order_id: int
    cents: int

    async def run(self, ctx: TaskContext) -> conveyor.Next:
        if ctx.step_attempt == 1:  # this step's first attempt
            raise ConnectionError("the card network timed out")
        print(f"order {self.order_id}: charged {self.cents / 100:.2f}")
        return conveyor.next(Ship(self.order_id))


@orders.step
@dataclass
class Ship:
    order_id: int

    async def run(self, ctx: TaskContext) -> conveyor.Next:
        print(f"order {self.order_id}: shipped")
        return conveyor.next(Remind(self.order_id), delay=REMIND_AFTER)


@orders.step
@dataclass
class Remind:
    order_id: int

    async def run(self, ctx: TaskContext) -> conveyor.Done:
        print(f"order {self.order_id}: asked for a review")
        return conveyor.done({"order_id": self.order_id, "status": "complete"})


async def main() -> None:
    async with app:
        handle = await orders.start_async(Reserve(order_id=42, items=["book", "lamp"]))
        worker = app.worker(poll_interval=0.1, handle_signals=False)
        running = asyncio.create_task(worker.run())
        try:
            print("result:", await handle.result_async(timeout=60))
        finally:
            worker.request_stop()
            await running
        task = await handle.get_async()
        print("steps:", " -> ".join(f"{a.step}:{a.outcome.value}" for a in task.attempts))


if __name__ == "__main__":
    asyncio.run(main())
