"""Checked by mypy (tests/typing/test_typing.py), never run: each line marked
``# error: CODE`` must be reported by mypy with that code, and no other."""

from __future__ import annotations

import conveyor
from conveyor import TaskContext

app = conveyor.App("memory://typing")


@app.task
async def add(a: int, b: int = 0) -> int:
    return a + b


@app.task
def send(ctx: TaskContext, to: str) -> str:
    return to


def wants_text(text: str) -> None:
    return None


def wrong() -> None:
    wants_text(add.enqueue(a=1).result())  # error: arg-type
    add.enqueue(a="1")  # error: arg-type
    add.enqueue(c=1)  # error: call-arg
    send.enqueue()  # error: call-arg
    wants_text(send.enqueue(to="x").result())


def total() -> str:
    return add.options(delay=1).enqueue(a=1).result()  # error: return-value
