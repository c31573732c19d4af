"""A tiny app for the CLI tests: one task that succeeds, one that raises."""

from __future__ import annotations

import conveyor

app = conveyor.App()


@app.task()
def add(a: int, b: int) -> int:
    return a + b


@app.task()
def explode(message: str) -> None:
    raise ValueError(message)
