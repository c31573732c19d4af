"""The App that chaos workers run: tasks, workflows and coroutines that keep an effects ledger.

Every execution appends a ``start`` line when it begins and an ``end`` line
when its body has finished (before the worker records the attempt's completion)
to the ledger file named by ``CONVEYOR_CHAOS_LEDGER``, so an execution whose
completion the fence rejected, or that was killed, is still visible to the
checker. Lines are single ``write`` calls on a file opened with
``O_APPEND``: concurrent workers never interleave within a line. Each line
carries ``seq``: how many transitions of its task had committed when the
execution began (always 0 for a plain task; the step's position in a
workflow; the poll's number in a coroutine), which is how the checker tells
a step re-run after its transition committed from one re-run after a crash.

The workload:

* ``chaos_work``: a plain task that sleeps and returns its ``i``.
* ``chaos_flow``: a workflow of ``hops`` steps (``Hop``); it ends with the
  list of hops it committed, ``[0, 1, ..., hops - 1]``.
* ``chaos_gather``: a coroutine that spawns ``children`` ``chaos_work``
  children and collects their results from their end messages, plus every
  outside message, until an outside ``"last"``; it ends with what it
  collected, sorted: a message consumed twice or lost shows in that list.
* ``chaos_tick``: fired by a schedule every second (missed slots all fire,
  up to 1,000 of them): each slot's task must exist once, with no slot
  missing between the first and the last.
* ``chaos_race``: enqueued by racing processes (``tools.chaos.race``), each
  under the unique key ``race:K`` held while it is stored: one task per key.
* ``chaos_tagged``: a plain task that sleeps and returns its ``tag``, a
  value unique to the task as enqueued (the ``wipe`` run, :mod:`.wipe`: a
  task that ends with another's tag was completed by an attempt it was not
  claimed for). Its ledger lines carry the tag.
* ``chaos_collect``: a chord's callback (its members are ``chaos_work``
  tasks): it receives their outcomes and returns their results in order (a
  member that did not succeed shows as its state), so a member missed or
  counted twice shows in its result; the checker also wants it run once,
  its first start after every member's last end, and no member started
  after it (the ``chord`` and ``early_callback`` checks of
  :mod:`tools.chaos.checker`).
* ``chaos_cpu_thread`` / ``chaos_cpu_process``: hold the GIL (one C call that
  does not release it) for ``hold_ms``; the thread handler only in its first
  attempt, since a thread handler's GIL-holding call starves its worker's
  heartbeat (a documented limit), while a process handler holds only its own
  child's GIL and keeps its lease.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import conveyor
from conveyor import App, RetryPolicy, TaskContext

TASK_NAME = "chaos_work"
TAGGED_NAME = "chaos_tagged"
TICK_NAME = "chaos_tick"
TICK_SECONDS = 1.0
RACE_NAME = "chaos_race"
FLOW_NAME = "chaos_flow"
GATHER_NAME = "chaos_gather"
COLLECT_NAME = "chaos_collect"
CPU_THREAD_NAME = "chaos_cpu_thread"
CPU_PROCESS_NAME = "chaos_cpu_process"
LAST = "last"
"""The outside message that tells a gather no more outside messages come."""
LEDGER_ENV = "CONVEYOR_CHAOS_LEDGER"
# Faults reclaim tasks again and again: a budget this size is not spent by
# them, so every task can end succeeded and a lost one stands out.
RETRY = RetryPolicy(max_attempts=50, initial_interval=0.05, max_interval=0.5, jitter=0.0)

app = App()


def record(event: str, ctx: TaskContext, seq: int = 0, tag: str | None = None) -> None:
    """Append one ledger line for this execution (with the task's ``tag``, if any)."""
    fields: dict[str, Any] = {
        "event": event,
        "task": ctx.task_id,
        "attempt": ctx.attempt,
        "seq": seq,
        "worker": ctx.worker_id,
        "pid": os.getpid(),
        "at": time.time(),
    }
    if tag is not None:
        fields["tag"] = tag
    line = json.dumps(fields)
    fd = os.open(os.environ[LEDGER_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


@app.task(name=TASK_NAME, retry=RETRY)
async def chaos_work(ctx: TaskContext, i: int, sleep_ms: int) -> int:
    """Sleep ``sleep_ms`` (some tasks outlive their lease: the heartbeat must
    keep it) and return ``i``."""
    record("start", ctx)
    await asyncio.sleep(sleep_ms / 1000)
    record("end", ctx)
    return i


@app.task(name=TAGGED_NAME, retry=RETRY)
async def chaos_tagged(ctx: TaskContext, tag: str, sleep_ms: int) -> str:
    """Sleep ``sleep_ms`` and return ``tag``."""
    record("start", ctx, tag=tag)
    await asyncio.sleep(sleep_ms / 1000)
    record("end", ctx, tag=tag)
    return tag


@app.periodic(every=TICK_SECONDS, missed="all", catch_up=1000)
@app.task(name=TICK_NAME, retry=RETRY)
async def chaos_tick(ctx: TaskContext) -> None:
    """One slot of the schedule: recorded like every execution."""
    record("start", ctx)
    record("end", ctx)


@app.task(name=COLLECT_NAME, retry=RETRY)
async def chaos_collect(ctx: TaskContext, outcomes: list[dict[str, Any]]) -> list[Any]:
    """A chord's callback: its members' results in order (a member that did
    not succeed: its state)."""
    record("start", ctx)
    record("end", ctx)
    return [o["result"] if o["state"] == "succeeded" else o["state"] for o in outcomes]


def race_key(args: Mapping[str, Any]) -> str:
    return f"race:{args['k']}"


@app.task(name=RACE_NAME, retry=RETRY, unique=conveyor.Unique(key=race_key, scope="stored"))
async def chaos_race(ctx: TaskContext, k: int) -> int:
    """One key of the unique race: recorded like every execution; returns ``k``."""
    record("start", ctx)
    record("end", ctx)
    return k


flow = app.workflow(FLOW_NAME)


@flow.step(retry=RETRY)
@dataclass
class Hop:
    """One step of a chain of ``hops``; ``trail`` lists the hops committed before it."""

    hops: int
    sleep_ms: int
    trail: list[int]

    async def run(self, ctx: TaskContext) -> conveyor.Next | conveyor.Done:
        seq = len(self.trail)
        record("start", ctx, seq)
        await asyncio.sleep(self.sleep_ms / 1000)
        record("end", ctx, seq)
        trail = [*self.trail, seq]
        if len(trail) >= self.hops:
            return conveyor.done(trail)
        return conveyor.next(Hop(self.hops, self.sleep_ms, trail))


def gather_state(children: int, sleep_ms: int) -> dict[str, Any]:
    """A new gather's state."""
    return {"children": children, "sleep_ms": sleep_ms, "polls": 0, "got": [], "ended": 0}


@app.coroutine(GATHER_NAME, retry=RETRY)
async def chaos_gather(poll: conveyor.Poll) -> conveyor.Suspend | conveyor.Done:
    """The first poll spawns the children; every poll adds what its inbox
    holds to ``got`` (a child's result as ``child:<i>``, an outside message as
    itself); it ends once every child has ended and ``"last"`` has come."""
    state = poll.state
    seq = state["polls"]
    record("start", poll.ctx, seq)
    if seq == 0:
        for i in range(state["children"]):
            poll.spawn(chaos_work, args={"i": i, "sleep_ms": state["sleep_ms"]})
    for message in poll.inbox:
        if message.is_end:
            state["ended"] += 1
            state["got"].append(f"child:{message.body['result']}")
        else:
            state["got"].append(message.body)
    state["polls"] = seq + 1
    await asyncio.sleep(state["sleep_ms"] / 1000)
    record("end", poll.ctx, seq)
    if state["ended"] >= state["children"] and LAST in state["got"]:
        return conveyor.done(sorted(state["got"]))
    return conveyor.suspend()


def hold_gil(milliseconds: int) -> None:
    """Sleep inside one C call that keeps the GIL (``ctypes.PyDLL`` never
    releases it): no other thread of this interpreter runs meanwhile."""
    ctypes.PyDLL(None).usleep(milliseconds * 1000)


@app.task(name=CPU_THREAD_NAME, retry=RETRY)
def chaos_cpu_thread(ctx: TaskContext, i: int, hold_ms: int) -> int:
    """In its first attempt, hold the GIL for ``hold_ms``; return ``i``."""
    record("start", ctx)
    if ctx.attempt == 1:
        hold_gil(hold_ms)
    record("end", ctx)
    return i


@app.task(name=CPU_PROCESS_NAME, retry=RETRY, process=True)
def chaos_cpu_process(i: int, hold_ms: int) -> int:
    """Hold the GIL of this child process for ``hold_ms``; return ``i``."""
    hold_gil(hold_ms)
    return i
