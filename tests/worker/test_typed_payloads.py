"""Typed payloads: typed values in, stored as JSON, rebuilt for the handler;
typed results rebuilt by the handle; a stored payload that no longer fits
fails its attempt without retry."""

from __future__ import annotations

import dataclasses
import enum
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from uuid import UUID

import pydantic
import pytest
from typing_extensions import TypedDict

import conveyor
from conveyor import TaskState
from tests.conftest import PG_URL
from tests.worker.helpers import run_all


@dataclasses.dataclass
class Address:
    street: str
    city: str


class Order(pydantic.BaseModel):
    id: int
    amount: float
    tags: list[str] = []


class Size(enum.Enum):
    SMALL = "s"
    LARGE = "l"


class Window(TypedDict):
    opens: date
    closes: date


@dataclasses.dataclass
class Receipt:
    order_id: int
    at: datetime


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


async def test_typed_values_round_trip_on_every_backend(any_app: conveyor.App) -> None:
    app = any_app
    seen: dict[str, object] = {}

    @app.task()
    def book(
        when: datetime,
        ref: UUID,
        price: Decimal,
        size: Size,
        window: Window,
        nights: list[date],
        stay: timedelta,
        deposit: Decimal | None = None,
    ) -> Receipt:
        seen.update(
            when=when, ref=ref, price=price, size=size, window=window, nights=nights, stay=stay
        )
        return Receipt(order_id=1, at=when + stay)

    args = {
        "when": datetime(2024, 3, 1, 15, 0, tzinfo=UTC),
        "ref": UUID("12345678-1234-5678-1234-567812345678"),
        "price": Decimal("120.50"),
        "size": Size.LARGE,
        "window": {"opens": date(2024, 3, 1), "closes": date(2024, 3, 3)},
        "nights": [date(2024, 3, 1), date(2024, 3, 2)],
        "stay": timedelta(days=2),
    }
    async with app:
        handle = await book.enqueue_async(**args)
        [task] = await run_all(app, [handle])
        receipt = await handle.result_async(timeout=10)
    assert task.state is TaskState.SUCCEEDED, task.attempts
    assert task.payload == {
        "when": "2024-03-01T15:00:00Z",
        "ref": "12345678-1234-5678-1234-567812345678",
        "price": "120.50",
        "size": "l",
        "window": {"opens": "2024-03-01", "closes": "2024-03-03"},
        "nights": ["2024-03-01", "2024-03-02"],
        "stay": "P2D",
    }
    assert seen == args
    assert {name: type(value) for name, value in seen.items()} == {
        name: type(value) for name, value in args.items()
    }
    assert task.result == {"order_id": 1, "at": "2024-03-03T15:00:00Z"}
    assert receipt == Receipt(order_id=1, at=datetime(2024, 3, 3, 15, 0, tzinfo=UTC))
    # A handle built from the id alone returns the stored JSON.
    assert await app.handles([handle.id])[0].result_async() == task.result


async def test_a_wrong_type_is_refused_at_enqueue_and_nothing_is_stored(
    app: conveyor.App,
) -> None:
    @app.task()
    async def charge(order_id: int, at: datetime) -> None:
        return None

    async with app:
        with pytest.raises(conveyor.PayloadError, match="argument 'order_id' expects int, got str"):
            await charge.enqueue_async(order_id="7", at=datetime.now(UTC))
        with pytest.raises(conveyor.PayloadError, match="argument 'at' expects datetime"):
            await app.enqueue_many_async(
                charge, [{"order_id": 1, "at": datetime.now(UTC)}, {"order_id": 2, "at": "now"}]
            )
        assert await app.list_tasks_async() == []


def _stored_by_other_code(schema: str, name: str, args: dict[str, object]) -> int:
    """A task stored without this app's types, as older code (or another
    service) may have stored it."""
    producer = conveyor.App(PG_URL, schema=schema, allow_unregistered=True)
    try:
        return producer.enqueue(name, args).id
    finally:
        producer.close()


async def test_payload_that_no_longer_fits_the_model_fails_without_retry(
    app: conveyor.App, schema: str
) -> None:
    @app.task(retry=conveyor.RetryPolicy(max_attempts=5))
    async def charge(order: Order) -> None:
        return None

    with pytest.raises(conveyor.PayloadError, match="argument 'order' expects Order"):
        charge.enqueue(order={"id": "not a number", "amount": 1})
    task_id = _stored_by_other_code(schema, "charge", {"order": {"id": "x", "amount": 1}})
    async with app:
        [task] = await run_all(app, [app.handles([task_id])[0]])
    assert task.state is TaskState.FAILED
    assert len(task.attempts) == 1
    assert task.attempts[0].error_type == "conveyor.errors.PayloadError"
    message = task.attempts[0].error_message or ""
    assert (
        "the stored payload does not fit task 'charge': argument 'order' expects Order" in message
    )
    assert "at id" in message


async def test_a_stored_value_that_no_longer_parses_fails_without_retry(
    app: conveyor.App, schema: str
) -> None:
    @app.task(retry=conveyor.RetryPolicy(max_attempts=5))
    def remind(at: datetime) -> None:
        return None

    task_id = _stored_by_other_code(schema, "remind", {"at": "next tuesday"})
    async with app:
        [task] = await run_all(app, [app.handles([task_id])[0]])
    assert task.state is TaskState.FAILED
    [attempt] = task.attempts
    assert "argument 'at' expects datetime, got str 'next tuesday'" in (attempt.error_message or "")


async def test_a_result_that_does_not_fit_its_declared_type_fails_without_retry(
    app: conveyor.App,
) -> None:
    @app.task(retry=conveyor.RetryPolicy(max_attempts=5))
    async def count() -> int:
        return "many"  # type: ignore[return-value]

    async with app:
        [task] = await run_all(app, [await count.enqueue_async()])
    assert task.state is TaskState.FAILED
    [attempt] = task.attempts
    assert attempt.error_type == "conveyor.errors.PayloadError"
    assert "the result is not stored: the result of task 'count' expects int, got str" in (
        attempt.error_message or ""
    )


async def test_workflow_steps_with_typed_fields_round_trip(app: conveyor.App) -> None:
    flows = app.workflow("typed_flow")
    seen: list[object] = []

    @flows.step
    @dataclasses.dataclass
    class Wait:
        until: datetime
        size: Size

        async def run(self, ctx: conveyor.TaskContext) -> conveyor.Next:
            seen.append(self)
            return conveyor.next(Finish(self.until + timedelta(hours=1)))

    @flows.step
    @dataclasses.dataclass
    class Finish:
        at: datetime

        async def run(self, ctx: conveyor.TaskContext) -> conveyor.Done:
            seen.append(self)
            return conveyor.done(self.at.isoformat())

    start = datetime(2024, 1, 1, 9, tzinfo=UTC)
    async with app:
        handle = await flows.start_async(Wait(start, Size.SMALL))
        [task] = await run_all(app, [handle])
    assert task.state is TaskState.SUCCEEDED, task.attempts
    assert seen == [Wait(start, Size.SMALL), Finish(start + timedelta(hours=1))]
    assert task.result == "2024-01-01T10:00:00+00:00"


def nights_between(opens: date, closes: date) -> timedelta:
    """Registered by a test with ``process=True``: its child imports it bare."""
    return closes - opens


async def test_a_process_handler_gets_typed_arguments_and_a_typed_result(
    app: conveyor.App,
) -> None:
    nights = app.task(name="nights", process=True)(nights_between)
    async with app:
        handle = await nights.enqueue_async(opens=date(2024, 1, 1), closes=date(2024, 1, 4))
        [task] = await run_all(app, [handle])
        assert task.state is TaskState.SUCCEEDED, task.attempts
        assert task.result == "P3D"
        assert await handle.result_async(timeout=10) == timedelta(days=3)


def test_missing_required_argument_is_rejected_at_enqueue(app: conveyor.App) -> None:
    @app.task()
    async def ship(order: Order, to: Address) -> None:
        return None

    with pytest.raises(conveyor.PayloadError, match="missing a required argument"):
        ship.enqueue(order=Order(id=1, amount=1))
