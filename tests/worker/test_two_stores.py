"""Two stores served by one process (docs/scaling.md, "Several databases"):
one worker per App, side by side on one event loop, and a task of one store
that enqueues into the other after its own work (with an idempotency key)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

import conveyor
from tests.conftest import PG_URL, drop_schema, new_schema_name
from tests.worker.helpers import wait_terminal


@pytest.fixture
def two_apps(tmp_path: Path) -> Iterator[tuple[conveyor.App, conveyor.App]]:
    schema = new_schema_name()
    first = conveyor.App(PG_URL, schema=schema)
    second = conveyor.App(f"sqlite:///{tmp_path / 'second.db'}")
    yield first, second
    first.close()
    second.close()
    drop_schema(schema)


async def test_one_process_serves_two_stores_and_hands_work_across(
    two_apps: tuple[conveyor.App, conveyor.App],
) -> None:
    orders, mail = two_apps
    sent: list[str] = []

    @mail.task()
    async def send_receipt(order: int) -> str:
        sent.append(f"receipt {order}")
        return f"receipt {order}"

    @orders.task()
    async def place(order: int) -> int:
        keyed = send_receipt.options(idempotency_key=f"receipt-{order}")
        return (await keyed.enqueue_async(order)).id

    await orders.migrate_async()
    await mail.migrate_async()
    placed = [await place.enqueue_async(n) for n in range(5)]
    workers = [
        app.worker(concurrency=4, poll_interval=0.05, handle_signals=False) for app in two_apps
    ]
    running = [asyncio.create_task(w.run()) for w in workers]
    try:
        done = await wait_terminal(orders, [h.id for h in placed])
        receipts = await wait_terminal(mail, [t.result for t in done])
    finally:
        for worker in workers:
            worker.request_stop()
        await asyncio.gather(*running)
    assert {t.state for t in done} == {conveyor.TaskState.SUCCEEDED}
    assert sorted(t.result for t in receipts) == [f"receipt {n}" for n in range(5)]
    assert sorted(sent) == [f"receipt {n}" for n in range(5)]
