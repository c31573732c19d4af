"""A chaos run: real ``conveyor worker`` processes on one backend, under a fault.

The harness enqueues ``tasks`` tasks of ``chaos_work`` (see ``app.py``; each
sleeps 20-200 ms, one in ``long_every`` sleeps 1.5 leases so the heartbeat
must keep its lease), starts ``workers`` worker processes and, until every
task has ended (at most ``fault_seconds``), applies the scenario's fault
every ``fault_interval`` seconds. Then it heals the workers (continues the
stopped ones, respawns the dead), waits up to ``settle_seconds`` for every
task to end, stops the workers with SIGTERM and hands the history to
:mod:`tools.chaos.checker`: the tasks with their attempt log, the effects
ledger the handlers wrote, and the faults file where every spawn, kill,
stop, continue and stop request is recorded with its time.

Scenarios: ``control`` (no fault: no task may run twice), ``kill`` (SIGKILL
a random worker and start a new one), ``stop`` (SIGSTOP a random worker for
twice the lease, then SIGCONT: its late endings must be rejected), ``term``
(SIGTERM a random worker, which drains for one lease and releases the rest,
and start a new one), ``net`` (PostgreSQL only: the workers connect through
a TCP proxy that alternately resets every connection or swallows every
packet for twice the lease).

Limits: times compare the worker's wall clock (ledger, faults) with the
backend's clock (attempt rows); both are this machine's.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from conveyor import App, Task, TaskState
from tools.chaos.app import LEDGER_ENV, RETRY, TASK_NAME
from tools.chaos.checker import Report, check, read_events, read_ledger
from tools.proxy import Proxy

ROOT = Path(__file__).resolve().parents[2]
LIVE_STATES = (TaskState.PENDING, TaskState.IN_PROGRESS, TaskState.WAITING)


@dataclass(frozen=True, slots=True)
class Profile:
    """How big and how long a run is."""

    tasks: int = 2000
    workers: int = 4
    concurrency: int = 4
    lease: float = 2.0
    poll_interval: float = 0.5
    fault_seconds: float = 60.0
    fault_interval: float = 2.0
    settle_seconds: float = 60.0
    min_sleep_ms: int = 20
    max_sleep_ms: int = 200
    long_every: int = 50


SMOKE = Profile()
SOAK = Profile(tasks=20_000, workers=4, concurrency=8, fault_seconds=600.0)


class Workers:
    """The worker processes of a run; every change is written to the faults file."""

    def __init__(
        self, env: dict[str, str], profile: Profile, workdir: Path, proxy: Proxy | None = None
    ) -> None:
        self.env = env
        self.proxy = proxy
        self.profile = profile
        self.workdir = workdir
        self.faults = workdir / "faults.jsonl"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.stopped: set[int] = set()
        self.spawned = 0

    def record(self, event: str, pid: int) -> None:
        with self.faults.open("a") as out:
            out.write(json.dumps({"event": event, "pid": pid, "at": time.time()}) + "\n")

    def spawn(self) -> subprocess.Popen[bytes]:
        p = self.profile
        command = [
            sys.executable,
            "-m",
            "conveyor.cli",
            "worker",
            "tools.chaos.app:app",
            "--concurrency",
            str(p.concurrency),
            "--lease",
            str(p.lease),
            "--poll-interval",
            str(p.poll_interval),
            "--grace",
            str(p.lease),
            "--log-level",
            "WARNING",
        ]
        self.spawned += 1
        log = (self.workdir / f"worker-{self.spawned}.log").open("wb")
        proc = subprocess.Popen(
            command, env=self.env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT
        )
        log.close()
        self.procs.append(proc)
        self.record("spawn", proc.pid)
        return proc

    def running(self) -> list[subprocess.Popen[bytes]]:
        return [p for p in self.procs if p.poll() is None and p.pid not in self.stopped]

    def signal(self, proc: subprocess.Popen[bytes], event: str, signum: int) -> None:
        self.record(event, proc.pid)
        proc.send_signal(signum)

    def heal(self) -> None:
        """Continue every stopped worker; replace every dead one."""
        self.continue_stopped()
        missing = self.profile.workers - len([p for p in self.procs if p.poll() is None])
        for _ in range(missing):
            self.spawn()

    def stop_all(self, timeout: float) -> list[int]:
        """SIGTERM every live worker, SIGKILL the ones still there after ``timeout``."""
        self.continue_stopped()
        for proc in self.procs:
            if proc.poll() is None:
                self.signal(proc, "term", signal.SIGTERM)
        deadline = time.monotonic() + timeout
        codes = []
        for proc in self.procs:
            try:
                codes.append(proc.wait(max(deadline - time.monotonic(), 0.1)))
            except subprocess.TimeoutExpired:
                self.signal(proc, "kill", signal.SIGKILL)
                codes.append(proc.wait())
        return codes

    def continue_stopped(self) -> None:
        for proc in self.procs:
            if proc.pid in self.stopped and proc.poll() is None:
                self.signal(proc, "cont", signal.SIGCONT)
        self.stopped.clear()


Fault = Callable[[Workers, random.Random], Awaitable[None]]


async def kill_one(workers: Workers, rng: random.Random) -> None:
    """SIGKILL a random running worker and start a new one."""
    running = workers.running()
    if running:
        victim = rng.choice(running)
        workers.signal(victim, "kill", signal.SIGKILL)
        await asyncio.to_thread(victim.wait)
    workers.spawn()


async def stop_one(workers: Workers, rng: random.Random) -> None:
    """SIGSTOP a random running worker for twice the lease, then SIGCONT it."""
    running = workers.running()
    if not running:
        return
    victim = rng.choice(running)
    workers.signal(victim, "stop", signal.SIGSTOP)
    workers.stopped.add(victim.pid)
    await asyncio.sleep(2 * workers.profile.lease)
    if victim.poll() is None:
        workers.signal(victim, "cont", signal.SIGCONT)
    workers.stopped.discard(victim.pid)


async def term_one(workers: Workers, rng: random.Random) -> None:
    """SIGTERM a random running worker and start its replacement at once: it
    drains for its grace (one lease), then releases what still runs (the long
    tasks) as ``interrupted``, to be run again elsewhere."""
    running = workers.running()
    if running:
        victim = rng.choice(running)
        workers.signal(victim, "term", signal.SIGTERM)
        workers.spawn()
        await asyncio.to_thread(victim.wait)


async def cut_network(workers: Workers, rng: random.Random) -> None:
    """Between the workers and PostgreSQL: reset every connection (RST), or
    swallow every packet for twice the lease, then deliver again."""
    proxy = workers.proxy
    assert proxy is not None
    log = workers.workdir / "network.jsonl"
    if rng.random() < 0.5:
        reset = proxy.cut()
        _note(log, {"event": "cut", "connections": reset, "at": time.time()})
        return
    proxy.blackhole()
    _note(log, {"event": "blackhole", "at": time.time()})
    await asyncio.sleep(2 * workers.profile.lease)
    proxy.restore()
    _note(log, {"event": "restore", "at": time.time()})


def _note(path: Path, record: dict[str, object]) -> None:
    with path.open("a") as out:
        out.write(json.dumps(record) + "\n")


SCENARIOS: dict[str, Fault | None] = {
    "control": None,
    "kill": kill_one,
    "stop": stop_one,
    "term": term_one,
    "net": cut_network,
}
NETWORK_SCENARIOS = frozenset({"net"})
"""Scenarios whose workers reach PostgreSQL through a proxy (not SQLite)."""


async def unfinished(client: App) -> int:
    """How many tasks have not ended (a lower bound past 1000 of one state)."""
    found = 0
    for state in LIVE_STATES:
        found += len(await client.list_tasks_async(state=state, name=TASK_NAME, limit=1000))
    return found


async def enqueue(client: App, profile: Profile, rng: random.Random) -> list[int]:
    def sleep_ms(i: int) -> int:
        if profile.long_every and i % profile.long_every == 0:
            return int(profile.lease * 1500)
        return rng.randint(profile.min_sleep_ms, profile.max_sleep_ms)

    ids: list[int] = []
    for start in range(0, profile.tasks, 500):
        batch = [
            {"i": i, "sleep_ms": sleep_ms(i)} for i in range(start, min(start + 500, profile.tasks))
        ]
        handles = await client.enqueue_many_async(TASK_NAME, batch, retry=RETRY)
        ids += [h.id for h in handles]
    return ids


async def wait_until_done(client: App, seconds: float, step: float = 0.5) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if await unfinished(client) == 0:
            return True
        await asyncio.sleep(step)
    return False


async def run(
    url: str,
    scenario: str,
    workdir: Path,
    profile: Profile = SMOKE,
    *,
    schema: str | None = None,
    seed: int = 0,
    log: Callable[[str], None] = lambda _line: None,
) -> Report:
    """One chaos run in a fresh store; the checker's report (also written to
    ``workdir/report.json``)."""
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}: one of {', '.join(SCENARIOS)}")
    rng = random.Random(seed)
    await asyncio.to_thread(workdir.mkdir, parents=True, exist_ok=True)
    ledger = workdir / "ledger.jsonl"
    env = {**os.environ, "CONVEYOR_URL": url, LEDGER_ENV: str(ledger), "PYTHONPATH": str(ROOT)}
    if schema is not None:
        env["CONVEYOR_SCHEMA"] = schema
    proxy = None
    if scenario in NETWORK_SCENARIOS:
        if not url.startswith("postgres"):
            raise ValueError(f"the {scenario!r} scenario needs PostgreSQL")
        proxy = Proxy(url)
        proxy.start()
        env["CONVEYOR_URL"] = proxy.url
    try:
        return await _run(url, scenario, workdir, profile, schema, rng, env, proxy, log)
    finally:
        if proxy is not None:
            proxy.stop()


async def _run(
    url: str,
    scenario: str,
    workdir: Path,
    profile: Profile,
    schema: str | None,
    rng: random.Random,
    env: dict[str, str],
    proxy: Proxy | None,
    log: Callable[[str], None],
) -> Report:
    fault = SCENARIOS[scenario]
    ledger = Path(env[LEDGER_ENV])
    client = App(url, schema=schema, allow_unregistered=True)
    async with client:
        ids = await enqueue(client, profile, rng)
        log(f"{scenario}: {len(ids)} tasks enqueued; {profile.workers} workers")
        workers = Workers(env, profile, workdir, proxy)
        for _ in range(profile.workers):
            workers.spawn()
        initial = profile.workers
        try:
            started = time.monotonic()
            while time.monotonic() - started < profile.fault_seconds:
                if await unfinished(client) == 0:
                    break
                if fault is not None:
                    await fault(workers, rng)
                await asyncio.sleep(profile.fault_interval)
            log(f"{scenario}: faults over after {time.monotonic() - started:.1f}s; settling")
            if proxy is not None:
                proxy.restore()
            workers.heal()
            settled = await wait_until_done(client, profile.settle_seconds)
            log(f"{scenario}: {'settled' if settled else 'NOT settled'}")
        finally:
            await asyncio.to_thread(workers.stop_all, profile.lease + 10)
        tasks: dict[int, Task] = {}
        for task_id in ids:
            found = await client.get_async(task_id)
            if found is not None:
                tasks[task_id] = found
        if schema is not None:  # a throwaway schema; a SQLite file stays in workdir
            await (await client.backend()).destroy()
    report = check(
        enqueued=ids,
        tasks=tasks,
        ledger=read_ledger(_lines(ledger)),
        faults=read_events(_lines(workers.faults)),
        lease=profile.lease,
        poll_interval=profile.poll_interval,
        control=fault is None,
        initial_workers=initial,
        single_writer=url.startswith("sqlite"),
    )
    (workdir / "report.json").write_text(json.dumps(report.to_json(), indent=2))
    for task in tasks.values():
        if task.state is TaskState.FAILED:
            last = task.last_attempt
            reason = f"{last.outcome}: {last.error_type}: {last.error_message}" if last else "-"
            log(f"{scenario}: task {task.id} failed after {task.attempt} attempts ({reason})")
    return report


def _lines(path: Path) -> Sequence[str]:
    return path.read_text().splitlines() if path.exists() else []
