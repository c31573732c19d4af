"""Typed payloads: dataclasses and pydantic models in, rebuilt for the handler."""

from __future__ import annotations

import dataclasses

import pydantic
import pytest

import conveyor
from conveyor import TaskState
from tests.worker.helpers import run_all


@dataclasses.dataclass
class Address:
    street: str
    city: str


class Order(pydantic.BaseModel):
    id: int
    amount: float
    tags: list[str] = []


async def test_dataclass_and_model_arguments_round_trip(app: conveyor.App) -> None:
    seen: list[object] = []

    @app.task()
    async def ship(order: Order, to: Address, note: str = "") -> str:
        seen.extend([order, to, note])
        return f"{order.id} to {to.city}"

    async with app:
        handle = await ship.enqueue_async(
            order=Order(id=7, amount=9.5, tags=["gift"]), to=Address("Main St", "Lyon")
        )
        [task] = await run_all(app, [handle])
    assert task.state is TaskState.SUCCEEDED
    assert task.payload == {
        "order": {"id": 7, "amount": 9.5, "tags": ["gift"]},
        "to": {"street": "Main St", "city": "Lyon"},
    }
    assert seen == [Order(id=7, amount=9.5, tags=["gift"]), Address("Main St", "Lyon"), ""]
    assert task.result == "7 to Lyon"


async def test_payload_that_no_longer_fits_the_model_fails_without_retry(
    app: conveyor.App,
) -> None:
    @app.task(retry=conveyor.RetryPolicy(max_attempts=5))
    async def charge(order: Order) -> None:
        return None

    async with app:
        # Stored as plain JSON that the model rejects (e.g. code changed since).
        handle = await charge.enqueue_async(order={"id": "not a number", "amount": 1})
        [task] = await run_all(app, [handle])
    assert task.state is TaskState.FAILED
    assert len(task.attempts) == 1
    assert task.attempts[0].error_type == "conveyor.errors.PayloadError"


def test_missing_required_argument_is_rejected_at_enqueue(app: conveyor.App) -> None:
    @app.task()
    async def ship(order: Order, to: Address) -> None:
        return None

    with pytest.raises(conveyor.PayloadError, match="missing a required argument"):
        ship.enqueue(order=Order(id=1, amount=1))
