"""FastAPI with conveyor: the App opens with the web app and closes with it.

``POST /welcome`` enqueues a task on its own. ``POST /orders`` stores an order
and enqueues its charge in one transaction of the request: both commit, or
neither does.

Run it with ``DATABASE_URL=postgresql://... uvicorn fastapi_app:api``, and a
worker, with the same environment, with ``conveyor worker fastapi_app:tasks``.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import psycopg
from fastapi import FastAPI, HTTPException
from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel

import conveyor

DATABASE_URL = os.environ.get("DATABASE_URL", "postgresql://127.0.0.1:5432/app")

# The tasks live in the application's own database, in the schema
# CONVEYOR_SCHEMA names (default "conveyor").
tasks = conveyor.App(DATABASE_URL)
# The application's own connections, for its own tables.
pool = AsyncConnectionPool(DATABASE_URL, open=False)

ORDERS_TABLE = """
create table if not exists orders (
    reference text primary key,
    cents integer not null,
    charge_task bigint not null
)
"""


@tasks.task(queue="mail")
async def send_welcome(email: str) -> str:
    """Send the welcome email (a worker runs this)."""
    return f"welcomed {email}"


@tasks.task(retry=conveyor.RetryPolicy(max_attempts=5))
async def charge_order(reference: str, cents: int) -> str:
    """Charge the order with the payment provider (a worker runs this)."""
    return f"charged {cents} for {reference}"


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    # `async with tasks` connects to the store (creating or upgrading its
    # schema) before the first request, and closes it at shutdown.
    async with tasks, pool:
        async with pool.connection() as conn:
            await conn.execute(ORDERS_TABLE)
        yield


api = FastAPI(lifespan=lifespan)


class Welcome(BaseModel):
    email: str


class Order(BaseModel):
    reference: str
    cents: int


@api.post("/welcome", status_code=202)
async def welcome(body: Welcome) -> dict[str, int]:
    # Durable when enqueue_async returns: a worker will run it.
    handle = await send_welcome.enqueue_async(email=body.email)
    return {"task_id": handle.id}


@api.post("/orders", status_code=201)
async def place_order(order: Order) -> dict[str, int]:
    async with pool.connection() as conn:
        try:
            async with conn.transaction():
                # The task is inserted on this connection, inside this transaction...
                charge = charge_order.options(connection=conn)
                handle = await charge.enqueue_async(reference=order.reference, cents=order.cents)
                # ...so if anything after it fails (here: a reference already
                # taken), the rollback takes the task away with the order.
                await conn.execute(
                    "insert into orders (reference, cents, charge_task) values (%s, %s, %s)",
                    (order.reference, order.cents, handle.id),
                )
        except psycopg.errors.UniqueViolation:
            raise HTTPException(409, f"order {order.reference} exists") from None
    # Committed: the order and its charge task exist together.
    return {"charge_task": handle.id}
