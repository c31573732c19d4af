"""A tiny app for the CLI tests: a task that succeeds, one that raises, a two-step
workflow, a coroutine that collects messages."""

from __future__ import annotations

from dataclasses import dataclass

import conveyor

app = conveyor.App()


@app.task()
def add(a: int, b: int) -> int:
    return a + b


@app.task()
def explode(message: str) -> None:
    raise ValueError(message)


greeting = app.workflow("greeting")


@greeting.step
@dataclass
class Hello:
    name: str

    async def run(self, ctx: conveyor.TaskContext) -> conveyor.Next:
        return conveyor.next(Goodbye(self.name))


@greeting.step
@dataclass
class Goodbye:
    name: str

    async def run(self, ctx: conveyor.TaskContext) -> conveyor.Done:
        return conveyor.done(f"bye {self.name}")


@app.coroutine("echo")
async def echo(poll: conveyor.Poll) -> conveyor.Suspend | conveyor.Done:
    """Collect message bodies; done with them once ``want`` have arrived."""
    got = poll.state.setdefault("got", [])
    got.extend(m.body for m in poll.inbox)
    if len(got) >= poll.state["want"]:
        return conveyor.done(got)
    return conveyor.suspend()


@app.task(queue="mail", retry=conveyor.RetryPolicy(max_attempts=7), timeout=30)
def notify(to: str) -> str:
    """Declares its own queue, retry policy and timeout."""
    return f"notified {to}"
