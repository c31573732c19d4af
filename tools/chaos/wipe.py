"""The ``wipe`` run: a Redis server restarted empty under running workers.

A store that loses its data (Redis without persistence, restarted) hands
task ids out again from 1: a task enqueued after the loss reuses the id of
a task whose attempt may still run in a live worker. Losing the work the
server forgot is the documented price of such a server; completing the
new task with the old attempt's result is not.

The run starts ``workers`` worker processes (``tools.chaos.app``) on a
Redis server of its own with persistence off, then, ``rounds`` times:
enqueues ``tasks`` ``chaos_tagged`` tasks, each with a tag unique to it,
waits until the workers run half as many of them as they have slots (at
most ``start_seconds``), records the tasks the store holds, and restarts
the server empty. The last round is not wiped: the run waits until every
one of its tasks has ended, then checks (:func:`check_wipe`):

- no task ever ends with a result other than its own tag, in any round
  (what each round's store held just before its wipe, and the last
  round's store at the end): no attempt completed a task it was not
  claimed for;
- every task of the last round succeeded (a loss only takes what the
  server held when it restarted);
- every live worker is registered again (``workers`` lists its process);
- and that the fault was exercised: attempts of forgotten tasks ended
  after the wipe that forgot them, and some of their ids were given to
  new tasks.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from conveyor import App, Task, TaskState
from conveyor.errors import BackendUnavailableError
from tools.chaos.app import LEDGER_ENV, TAGGED_NAME
from tools.chaos.harness import ROOT, Profile, Workers
from tools.redis_server import RedisServer


@dataclass(frozen=True, slots=True)
class WipeProfile:
    """How big a ``wipe`` run is."""

    rounds: int = 3
    tasks: int = 120
    """Tasks per round."""
    workers: int = 3
    concurrency: int = 8
    lease: float = 2.0
    poll_interval: float = 0.5
    min_sleep_ms: int = 500
    max_sleep_ms: int = 2500
    start_seconds: float = 20.0
    """The longest wait for a round's tasks to start (and for the workers to
    register, at the start)."""
    settle_seconds: float = 60.0


WIPE_SMOKE = WipeProfile()


def forgetful_store(workdir: Path) -> RedisServer:
    """A Redis server of the run's own that keeps nothing across a restart
    (no append-only file, no snapshot), started. The caller stops it."""
    server = RedisServer(workdir / "redis", appendonly=False)
    server.start()
    return server


@dataclass(slots=True)
class WipeReport:
    """What :func:`check_wipe` found; ``ok`` when nothing breached and the
    fault was exercised."""

    rounds: int
    enqueued: int
    wrong_completions: list[str] = field(default_factory=list)
    """Tasks that ended with another task's tag (or none): "round R task ID: got X"."""
    lost_after_last_wipe: list[int] = field(default_factory=list)
    """Tasks of the last round that did not succeed."""
    unregistered_pids: list[int] = field(default_factory=list)
    """Live worker processes that ``workers`` does not list at the end."""
    late_ends: int = 0
    """Executions of a forgotten task that ended after the wipe that forgot it."""
    reused_ids: int = 0
    """Ids of forgotten tasks that a later round's task was given."""

    @property
    def ok(self) -> bool:
        breached = self.wrong_completions or self.lost_after_last_wipe or self.unregistered_pids
        return not breached and self.late_ends > 0 and self.reused_ids > 0

    def summary(self) -> str:
        return (
            f"wipe: {self.rounds} rounds, {self.enqueued} tasks; "
            f"{len(self.wrong_completions)} wrong completions, "
            f"{len(self.lost_after_last_wipe)} lost after the last wipe, "
            f"{len(self.unregistered_pids)} live workers unregistered; "
            f"{self.late_ends} late ends of forgotten tasks, {self.reused_ids} ids reused"
            + ("" if self.ok else f" -- BREACH: {self.wrong_completions[:5]}")
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _tag(task: Task) -> Any:
    return task.payload.get("tag") if isinstance(task.payload, Mapping) else None


def check_wipe(
    rounds: Sequence[Mapping[int, str]],
    held: Sequence[Sequence[Task]],
    wipes: Sequence[float],
    ledger: Iterable[Mapping[str, Any]],
    live_pids: Iterable[int],
    registered_pids: Iterable[int],
) -> WipeReport:
    """Check a ``wipe`` run: ``rounds`` are each round's tags by task id as
    enqueued; ``held[r]`` the ``chaos_tagged`` tasks the store held at the
    end of round ``r`` (before its wipe; the last round's, at the end);
    ``wipes[r]`` when round ``r``'s wipe began (one fewer than rounds);
    ``ledger`` the executions' lines (``tag`` in each)."""
    report = WipeReport(rounds=len(rounds), enqueued=sum(len(r) for r in rounds))
    for number, (tags, tasks) in enumerate(zip(rounds, held, strict=True)):
        for task in tasks:
            own = tags.get(task.id)
            if task.state is TaskState.SUCCEEDED and (task.result != own or _tag(task) != own):
                report.wrong_completions.append(
                    f"round {number} task {task.id}: tag {own!r}, stored {_tag(task)!r}, "
                    f"result {task.result!r}"
                )
    last = {task.id: task for task in held[-1]}
    report.lost_after_last_wipe = sorted(
        task_id
        for task_id in rounds[-1]
        if task_id not in last or last[task_id].state is not TaskState.SUCCEEDED
    )
    round_of = {tag: number for number, tags in enumerate(rounds) for tag in tags.values()}
    for line in ledger:
        forgotten = round_of.get(line.get("tag", ""))
        if line.get("event") == "end" and forgotten is not None and forgotten < len(wipes):
            report.late_ends += float(line["at"]) > wipes[forgotten]
    report.reused_ids = len(
        {task_id for tags in rounds[:-1] for task_id in tags}
        & {task_id for tags in rounds[1:] for task_id in tags}
    )
    report.unregistered_pids = sorted(set(live_pids) - set(registered_pids))
    return report


async def _retried(call: Any) -> Any:
    """A call of the harness's own client, retried while the server restarts."""
    while True:
        try:
            return await call()
        except BackendUnavailableError:
            await asyncio.sleep(0.1)


async def _enqueue_round(client: App, profile: WipeProfile, rng: random.Random) -> dict[int, str]:
    tags: dict[int, str] = {}
    for _ in range(profile.tasks):
        tag = uuid.uuid4().hex
        sleep_ms = rng.randint(profile.min_sleep_ms, profile.max_sleep_ms)
        args = {"tag": tag, "sleep_ms": sleep_ms}
        handle = await _retried(lambda a=args: client.enqueue_async(TAGGED_NAME, args=a))
        tags[handle.id] = tag
    return tags


async def _held(client: App) -> list[Task]:
    found = await _retried(lambda: client.list_tasks_async(name=TAGGED_NAME, limit=100_000))
    tasks = []
    for listed in found:
        task = await _retried(lambda t=listed.id: client.get_async(t))
        if task is not None:
            tasks.append(task)
    return tasks


async def _settle(client: App, ids: Iterable[int], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    waiting = set(ids)
    while waiting and time.monotonic() < deadline:
        for task_id in list(waiting):
            task = await _retried(lambda t=task_id: client.get_async(t))
            if task is not None and task.state.is_terminal:
                waiting.discard(task_id)
        await asyncio.sleep(0.2)


async def _running(client: App, count: int, seconds: float) -> None:
    """Wait until ``count`` tasks run (or time is up)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = await _retried(
            lambda: client.list_tasks_async(state=TaskState.IN_PROGRESS, limit=count)
        )
        if len(found) >= count:
            return
        await asyncio.sleep(0.05)


async def _registered(client: App, pids: set[int], seconds: float) -> set[int]:
    """The pids of live registered workers, once all of ``pids`` are (or time is up)."""
    deadline = time.monotonic() + seconds
    while True:
        found = await _retried(client.list_workers_async)
        registered = {w.pid for w in found if w.stopped_at is None}
        if pids <= registered or time.monotonic() > deadline:
            return registered
        await asyncio.sleep(0.2)


async def run_wipe(
    server: RedisServer, workdir: Path, profile: WipeProfile = WIPE_SMOKE, *, seed: int = 0
) -> WipeReport:
    """One ``wipe`` run on ``server`` (see :func:`forgetful_store`), in
    ``workdir``; its report (also ``workdir/report.json``)."""
    rng = random.Random(seed)
    await asyncio.to_thread(workdir.mkdir, parents=True, exist_ok=True)
    ledger = workdir / "ledger.jsonl"
    path = os.pathsep.join([str(ROOT / "src"), str(ROOT)])
    env = {**os.environ, "CONVEYOR_URL": server.url, LEDGER_ENV: str(ledger), "PYTHONPATH": path}
    env["CONVEYOR_SCHEMA"] = "chaos"
    workers = Workers(
        env,
        Profile(
            workers=profile.workers,
            concurrency=profile.concurrency,
            lease=profile.lease,
            poll_interval=profile.poll_interval,
        ),
        workdir,
    )
    rounds: list[dict[int, str]] = []
    held: list[list[Task]] = []
    wipes: list[float] = []
    client = App(server.url, schema="chaos", allow_unregistered=True)
    async with client:
        for _ in range(profile.workers):
            workers.spawn()
        try:
            spawned = {p.pid for p in workers.running()}
            await _registered(client, spawned, profile.start_seconds)
            busy = min(profile.tasks, profile.workers * profile.concurrency) // 2
            for number in range(profile.rounds):
                rounds.append(await _enqueue_round(client, profile, rng))
                if number == profile.rounds - 1:
                    break
                await _running(client, busy, profile.start_seconds)
                held.append(await _held(client))
                wipes.append(time.time())
                server.kill()
                await asyncio.to_thread(server.start)
                workers.replace_exited()
            await _settle(client, rounds[-1], profile.settle_seconds)
            held.append(await _held(client))
            live = {p.pid for p in workers.running()}
            registered = await _registered(client, live, 3 * profile.lease)
        finally:
            await asyncio.to_thread(workers.stop_all, workers.exit_bound())
    lines = ledger.read_text().splitlines() if ledger.exists() else []
    entries = []
    for line in lines:
        try:
            entries.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line torn by a kill
    report = check_wipe(rounds, held, wipes, entries, live, registered)
    (workdir / "report.json").write_text(json.dumps(report.to_json(), indent=2))
    return report
