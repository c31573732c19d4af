"""Checked by mypy (tests/typing/test_typing.py), never run: what a task's
definition and handles are typed as, from its handler."""

from __future__ import annotations

from datetime import datetime
from typing import Any, assert_type

import conveyor
from conveyor import BoundTask, TaskContext, TaskDef, TaskHandle

app = conveyor.App("memory://typing")


@app.task
async def add(a: int, b: int = 0) -> int:
    return a + b


@app.task(queue="mail", retry=conveyor.RetryPolicy(max_attempts=3))
def send(ctx: TaskContext, to: str, *, subject: str = "hi") -> list[str]:
    return [to, subject]


@app.task()
async def stamp() -> datetime:
    return datetime.now()


@app.task
def nothing() -> None:
    return None


def handles() -> None:
    assert_type(add.enqueue(a=1, b=2), TaskHandle[int])
    assert_type(add.enqueue(1), TaskHandle[int])
    assert_type(add.enqueue(a=1).result(), int)
    assert_type(add.enqueue(a=1).result(timeout=5), int)
    assert_type(add.options(delay=5).enqueue(a=1), TaskHandle[int])
    bound = add.options(queue="q").options(priority=1)
    assert_type(bound.enqueue(a=1), TaskHandle[int])
    assert isinstance(bound, BoundTask) and isinstance(add, TaskDef)
    assert_type(add.options().enqueue_many([{"a": 1}]), list[TaskHandle[int]])
    assert_type(send.enqueue(to="a@example.com"), TaskHandle[list[str]])
    assert_type(send.enqueue(to="a", subject="b").result(), list[str])
    assert_type(stamp.enqueue().result(), datetime)
    assert_type(nothing.enqueue().result(), None)
    # A handle from an id alone, or from enqueue by name, knows no result type.
    assert_type(app.enqueue("add", {"a": 1}), TaskHandle[Any])
    assert_type(app.handles([1])[0].result(), Any)


async def handles_async() -> None:
    handle = await add.enqueue_async(a=1)
    assert_type(handle, TaskHandle[int])
    assert_type(await handle.result_async(), int)
    assert_type(await send.options(delay=1).enqueue_async(to="x"), TaskHandle[list[str]])
