"""A chaos run: real ``conveyor worker`` processes on one backend, under a fault.

The harness enqueues the workload of ``app.py``: ``tasks`` plain tasks (each
sleeps 20-200 ms; one in ``long_every`` sleeps 1.5 leases so the heartbeat
must keep its lease), ``flows`` workflows of ``hops`` steps, and ``gathers``
coroutines that each spawn ``children`` tasks and take ``outside`` messages
the harness sends them during the run, then ``"last"``, and ``chords`` of
``chord_members`` short tasks and a callback that receives their outcomes
(spread among the plain tasks, so faults reach them). It starts
``workers`` worker processes and, until every task has ended (at most
``fault_seconds``), applies the scenario's fault every ``fault_interval``
seconds. Then it heals the workers (continues the stopped ones, respawns
the dead), waits up to ``settle_seconds`` for every task to end, stops the
workers with SIGTERM and hands the history to :mod:`tools.chaos.checker`:
the tasks with their attempt log and the results they must have, the
effects ledger the handlers wrote, and the faults file where every spawn,
kill, stop, continue and stop request is recorded with its time. A worker
that does not exit within its bound after SIGTERM is recorded as ``hung``
(a violation), told to log its asyncio tasks (SIGUSR1, into its worker
log), its thread stacks dumped to ``hung-PID.txt`` by py-spy when
installed, and killed.

Scenarios: ``control`` (no fault: no task may run twice), ``kill`` (SIGKILL
a random worker and start a new one), ``stop`` (SIGSTOP a random worker for
twice the lease, then SIGCONT: its late completions must be rejected), ``term``
(SIGTERM a random worker, which drains for one lease and releases the rest,
and start a new one), ``net`` (PostgreSQL only: the workers connect through
a TCP proxy that alternately resets every connection or swallows every
packet for twice the lease; PostgreSQL and Redis), ``restart`` (PostgreSQL:
the local cluster's immediate shutdown, which kills every server process
without a checkpoint, and a start with crash recovery; Redis: the run's own
server, with ``appendfsync always``, SIGKILLed and started again on its
files), ``bouncer`` (PostgreSQL: the workers connect through a PgBouncer
in transaction mode, ``pool_mode=transaction``, listening past it, and the
bouncer is restarted, cutting every connection through it), ``gil`` (no signal: the
workload gains handlers that hold the GIL for three leases, in a thread in
their first attempt, which freezes their worker and costs its leases, and
in a process executor, which must keep its lease).

Meanwhile ``racers`` processes race to enqueue the same ``race_keys``
unique tasks (:mod:`tools.chaos.race`), through the scenario's proxy or
restarts: the store must keep one task per key and answer every racer
with it.

A send whose outcome the harness cannot know (the connection failed) is
recorded as ``maybe``: the checker allows it at most once.

Limits: times compare the worker's wall clock (ledger, faults) with the
backend's clock (attempt rows); both are this machine's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from conveyor import App, Task, TaskState, chord
from conveyor.errors import BackendUnavailableError, TaskFinishedError
from conveyor.worker.config import DEFAULT_STOP_TIMEOUT
from tools.bouncer import Bouncer
from tools.chaos.app import (
    CPU_PROCESS_NAME,
    CPU_THREAD_NAME,
    LAST,
    LEDGER_ENV,
    RACE_NAME,
    RETRY,
    TASK_NAME,
    TICK_NAME,
    TICK_SECONDS,
    Hop,
    chaos_collect,
    chaos_gather,
    chaos_work,
    flow,
    gather_state,
)
from tools.chaos.checker import Expected, Report, check, read_events, read_ledger
from tools.proxy import Proxy
from tools.redis_server import RedisServer

ROOT = Path(__file__).resolve().parents[2]
LIVE_STATES = (TaskState.PENDING, TaskState.IN_PROGRESS, TaskState.WAITING)
PLAIN_BATCH = 500
"""Plain tasks per enqueue."""
EXIT_MARGIN = 20.0
"""Seconds past its grace and stop timeout a worker may take to exit (on a
loaded 2-core machine) before the harness records it as hung."""


@dataclass(frozen=True, slots=True)
class Profile:
    """How big and how long a run is."""

    tasks: int = 1200
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
    flows: int = 60
    hops: int = 3
    gathers: int = 20
    children: int = 5
    outside: int = 3
    """Outside messages each gather gets (before ``"last"``), one every ``fault_interval``."""
    cpu_tasks: int = 6
    """GIL-holding tasks per executor (thread, process), in the ``gil`` scenario only."""
    cpu_hold_leases: float = 3.0
    racers: int = 4
    """Processes that race to enqueue the same unique keys (``tools.chaos.race``)."""
    race_keys: int = 100
    chords: int = 40
    """Chords of ``chord_members`` ``chaos_work`` members and a ``chaos_collect``
    callback each, enqueued among the plain tasks' batches."""
    chord_members: int = 10
    """Each member sleeps ``min_sleep_ms``..``max_sleep_ms`` like a plain task
    (much shorter members end faster than a loaded store records their ends:
    leases held past their trust, reclaims late)."""


SMOKE = Profile()
SOAK = Profile(
    tasks=20_000,
    concurrency=8,
    fault_seconds=600.0,
    flows=1000,
    gathers=200,
    cpu_tasks=20,
    chords=200,
    chord_members=20,
)


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
        self.told: set[int] = set()
        """Workers sent SIGKILL or SIGTERM: their exits are the faults'."""
        self.spawned = 0
        self.cluster: tuple[str, str] | None = None
        """The local PostgreSQL cluster (version, name) a scenario restarts."""
        self.redis: RedisServer | None = None
        """The run's own Redis server, which a scenario restarts."""
        self.bouncer: Bouncer | None = None
        """The PgBouncer the workers go through, which a scenario restarts."""

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
        if signum in (signal.SIGKILL, signal.SIGTERM):
            self.told.add(proc.pid)
        proc.send_signal(signum)

    def replace_exited(self) -> list[tuple[int, int]]:
        """Replace every worker that exited without being told to (as a
        supervisor would; a worker whose store cannot be reached at start
        exits with code 2), recording ``exit``; return (pid, exit code) of each."""
        exited = []
        for proc in list(self.procs):
            code = proc.poll()
            if code is None or proc.pid in self.told:
                continue
            self.told.add(proc.pid)
            self.record("exit", proc.pid)
            exited.append((proc.pid, code))
            self.spawn()
        return exited

    def heal(self) -> None:
        """Continue every stopped worker; replace every dead one."""
        self.continue_stopped()
        missing = self.profile.workers - len([p for p in self.procs if p.poll() is None])
        for _ in range(missing):
            self.spawn()

    def stop_all(self, timeout: float) -> list[int]:
        """SIGTERM every live worker; one still there after ``timeout`` is hung
        (see :meth:`reap`)."""
        self.continue_stopped()
        for proc in self.procs:
            if proc.poll() is None:
                self.signal(proc, "term", signal.SIGTERM)
        deadline = time.monotonic() + timeout
        return [self.reap(proc, deadline - time.monotonic()) for proc in self.procs]

    def reap(self, proc: subprocess.Popen[bytes], timeout: float) -> int:
        """Wait up to ``timeout`` for a worker told to stop. One that is still
        there is recorded as ``hung`` (a violation), its Python stacks are
        written to ``hung-PID.txt`` (when py-spy is installed), and it is
        killed: a hang is reported, never waited for."""
        try:
            return proc.wait(max(timeout, 0.1))
        except subprocess.TimeoutExpired:
            self.record("hung", proc.pid)
            proc.send_signal(signal.SIGUSR1)  # the worker logs its asyncio tasks
            time.sleep(1.0)
            self.dump_stacks(proc.pid)
            self.signal(proc, "kill", signal.SIGKILL)
            return proc.wait()

    def dump_stacks(self, pid: int) -> None:
        spy = shutil.which("py-spy")
        if spy is None:
            return
        with (
            (self.workdir / f"hung-{pid}.txt").open("wb") as out,
            contextlib.suppress(OSError, subprocess.TimeoutExpired),
        ):
            subprocess.run(
                [spy, "dump", "--pid", str(pid), "--locals"],
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=60,
            )

    def exit_bound(self) -> float:
        """Seconds a worker may take to exit after SIGTERM: its grace (one
        lease), the stop timeout of the handlers it then stops, and a margin."""
        return self.profile.lease + DEFAULT_STOP_TIMEOUT + EXIT_MARGIN

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
        await asyncio.to_thread(workers.reap, victim, workers.exit_bound())


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


def local_cluster(url: str) -> tuple[str, str]:
    """The (version, name) of the local PostgreSQL cluster that serves ``url``'s
    port, from ``pg_lsclusters``; RuntimeError when there is none."""
    port = str(urlsplit(url).port or 5432)
    try:
        listing = subprocess.run(
            ["pg_lsclusters", "-h"], capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise RuntimeError(f"cannot list the local PostgreSQL clusters: {exc}") from exc
    for line in listing.splitlines():
        version, name, cluster_port, *_ = line.split()
        if cluster_port == port:
            return version, name
    raise RuntimeError(f"no local PostgreSQL cluster listens on port {port}: cannot restart it")


async def restart_database(workers: Workers, rng: random.Random) -> None:
    """Restart the store's server: the local PostgreSQL cluster in immediate
    mode (every server process killed, crash recovery at start), or the
    run's Redis server (SIGKILL, then a start that replays its append-only
    file); then let the workers work for twice the lease."""
    log = workers.workdir / "database.jsonl"
    _note(log, {"event": "restart", "at": time.time()})
    if workers.redis is not None:
        workers.redis.kill()
        await asyncio.to_thread(workers.redis.start)
        _note(log, {"event": "up", "at": time.time()})
        await asyncio.sleep(2 * workers.profile.lease)
        return
    assert workers.cluster is not None
    version, name = workers.cluster
    proc = await asyncio.create_subprocess_exec(
        *("pg_ctlcluster", "--skip-systemctl-redirect", "-m", "immediate"),
        *(version, name, "restart"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"pg_ctlcluster restart failed: {out.decode(errors='replace')}")
    _note(log, {"event": "up", "at": time.time()})
    await asyncio.sleep(2 * workers.profile.lease)


async def restart_bouncer(workers: Workers, rng: random.Random) -> None:
    """Restart the PgBouncer the workers go through (every connection through
    it cut, new ones refused until it is up), then let them work for a lease."""
    bouncer = workers.bouncer
    assert bouncer is not None
    log = workers.workdir / "bouncer.jsonl"
    _note(log, {"event": "restart", "at": time.time()})
    await asyncio.to_thread(bouncer.restart)
    _note(log, {"event": "up", "at": time.time()})
    await asyncio.sleep(workers.profile.lease)


def _note(path: Path, record: dict[str, object]) -> None:
    with path.open("a") as out:
        out.write(json.dumps(record) + "\n")


@dataclass(frozen=True, slots=True)
class Scenario:
    """A fault and what it needs."""

    fault: Fault | None
    server: bool = False
    """Needs a server (a network to cut, a server to restart): not SQLite."""
    proxy: bool = False
    """The workers reach the server through a :class:`Proxy`."""
    cpu: bool = False
    """The workload gains the GIL-holding handlers."""
    bouncer: bool = False
    """The workers reach PostgreSQL through a :class:`Bouncer`."""


SCENARIOS: dict[str, Scenario] = {
    "control": Scenario(None),
    "kill": Scenario(kill_one),
    "stop": Scenario(stop_one),
    "term": Scenario(term_one),
    "net": Scenario(cut_network, server=True, proxy=True),
    "restart": Scenario(restart_database, server=True),
    "bouncer": Scenario(restart_bouncer, server=True, bouncer=True),
    "gil": Scenario(None, cpu=True),
}
SERVER_ONLY = frozenset(name for name, s in SCENARIOS.items() if s.server)
"""Scenarios that need a server (a network, a server to restart): not SQLite."""


def redis_store(workdir: Path) -> RedisServer:
    """A Redis server of the run's own, started, in ``workdir``: every write
    synced to its append-only file before the reply (``appendfsync
    always``), so a restart loses nothing acknowledged. The caller stops it."""
    server = RedisServer(workdir / "redis")
    server.start()
    return server


async def unfinished(client: App) -> int | None:
    """How many tasks have not ended (a lower bound past 1000 of one state);
    None while the backend cannot be reached."""
    found = 0
    try:
        for state in LIVE_STATES:
            found += len(await client.list_tasks_async(state=state, limit=1000))
    except BackendUnavailableError:
        return None
    return found


@dataclass(slots=True)
class Workload:
    """What was enqueued: ids in order, and what each succeeded task must return."""

    ids: list[int] = field(default_factory=list)
    expected: dict[int, Expected] = field(default_factory=dict)
    gathers: list[int] = field(default_factory=list)
    holders: list[int] = field(default_factory=list)
    """The process handlers that hold the GIL (``gil`` only)."""
    sent: dict[int, list[str]] = field(default_factory=lambda: defaultdict(list))
    maybe: dict[int, list[str]] = field(default_factory=lambda: defaultdict(list))
    races: list[dict[int, int] | None] = field(default_factory=list)
    """What each racer of the unique race was answered (None: it failed)."""
    chords: list[tuple[list[int], int]] = field(default_factory=list)
    """Each chord's member ids, in order, and its callback's id."""

    def add(self, ids: Sequence[int], results: Sequence[Any]) -> None:
        self.ids += ids
        self.expected.update((i, Expected(r)) for i, r in zip(ids, results, strict=True))

    def close(self, children: int) -> None:
        """Each gather's expected messages, once the harness has sent them all."""
        for g in self.gathers:
            mail = tuple(f"child:{i}" for i in range(children)) + tuple(self.sent[g])
            self.expected[g] = Expected(messages=mail, maybe=tuple(self.maybe[g]))


async def enqueue(client: App, profile: Profile, rng: random.Random, cpu: bool) -> Workload:
    def sleep_ms(i: int) -> int:
        if profile.long_every and i % profile.long_every == 0:
            return int(profile.lease * 1500)
        return rng.randint(profile.min_sleep_ms, profile.max_sleep_ms)

    work = Workload()
    starts = range(0, profile.tasks, PLAIN_BATCH)
    chords_per_batch = -(-profile.chords // max(len(starts), 1))
    for start in starts:
        numbers = range(start, min(start + PLAIN_BATCH, profile.tasks))
        batch = [{"i": i, "sleep_ms": sleep_ms(i)} for i in numbers]
        handles = await client.enqueue_many_async(TASK_NAME, batch, retry=RETRY)
        work.add([h.id for h in handles], list(numbers))
        more = min(chords_per_batch, profile.chords - len(work.chords))
        await enqueue_chords(client, work, profile, rng, more)
    await enqueue_chords(client, work, profile, rng, profile.chords - len(work.chords))
    flows = [flow.new_workflow(Hop(profile.hops, sleep_ms(1), [])) for _ in range(profile.flows)]
    handles = await client.enqueue_new_async(flows)
    work.add([h.id for h in handles], [list(range(profile.hops))] * len(flows))
    gathers = [
        chaos_gather.new_coroutine(gather_state(profile.children, sleep_ms(1)))
        for _ in range(profile.gathers)
    ]
    work.gathers = [h.id for h in await client.enqueue_new_async(gathers)]
    work.ids += work.gathers
    if cpu:
        work.holders = await enqueue_gil_holders(client, profile, CPU_PROCESS_NAME)
        work.add(work.holders, list(range(profile.cpu_tasks)))
    return work


async def enqueue_chords(
    client: App, work: Workload, profile: Profile, rng: random.Random, count: int
) -> None:
    """``count`` chords, each one enqueue: ``chord_members`` ``chaos_work``
    members returning ``0..chord_members-1`` and a ``chaos_collect`` callback
    that must return that list (the signatures are of the workers' App:
    stored through ``client``, the run's store)."""
    expected = list(range(profile.chord_members))
    for _ in range(count):
        members = [
            chaos_work.s(i=i, sleep_ms=rng.randint(profile.min_sleep_ms, profile.max_sleep_ms))
            for i in expected
        ]
        tasks = chord(members, chaos_collect.s().receiving("outcomes")).new_tasks()
        *ids, callback = [h.id for h in await client.enqueue_new_async(tasks)]
        work.add(ids, expected)
        work.add([callback], [expected])
        work.chords.append((ids, callback))


async def enqueue_gil_holders(client: App, profile: Profile, name: str) -> list[int]:
    """``cpu_tasks`` tasks of ``name`` that hold the GIL, ahead of every other task."""
    hold_ms = int(profile.cpu_hold_leases * profile.lease * 1000)
    batch = [{"i": i, "hold_ms": hold_ms} for i in range(profile.cpu_tasks)]
    handles = await client.enqueue_many_async(name, batch, retry=RETRY, priority=10)
    return [h.id for h in handles]


async def hold_gil_in_threads(client: App, work: Workload, profile: Profile) -> None:
    """Once every process handler has ended, enqueue the thread handlers: a
    thread handler holding the GIL freezes its whole worker, heartbeat
    included, and would cost a process handler running there its lease too."""
    while True:  # polled: the store is the only place that knows
        holders = await _stored(client, work.holders)
        if all(t.state.is_terminal for t in holders.values()):
            break
        await asyncio.sleep(0.5)
    threads = await enqueue_gil_holders(client, profile, CPU_THREAD_NAME)
    work.add(threads, list(range(profile.cpu_tasks)))


async def send_mail(client: App, work: Workload, profile: Profile) -> None:
    """Send each gather ``outside`` messages, one round every fault interval,
    then ``"last"`` until it is known to have arrived."""
    for n in range(profile.outside):
        for g in work.gathers:
            body = f"m{n}"
            try:
                await client.send_async(g, body)
                work.sent[g].append(body)
            except BackendUnavailableError:
                work.maybe[g].append(body)
        await asyncio.sleep(profile.fault_interval)
    for g in work.gathers:
        while True:
            try:
                await client.send_async(g, LAST)
                work.sent[g].append(LAST)
                break
            except TaskFinishedError:  # a "last" whose outcome was unknown arrived
                break
            except BackendUnavailableError:
                work.maybe[g].append(LAST)
                await asyncio.sleep(0.5)


RACE_HEAD_START = 3.0
"""Seconds between spawning the racers and their start: time to import."""


def spawn_racers(
    profile: Profile, env: dict[str, str], workdir: Path
) -> list[tuple[Path, subprocess.Popen[bytes]]]:
    """The racers of the unique race, each with the file it writes."""
    start = time.time() + RACE_HEAD_START
    procs = []
    for n in range(profile.racers):
        out = workdir / f"race-{n}.json"
        command = [sys.executable, "-m", "tools.chaos.race", "--keys", str(profile.race_keys)]
        command += ["--seed", str(n), "--start", str(start), "--out", str(out)]
        with (workdir / f"race-{n}.log").open("wb") as log:
            procs.append(
                (out, subprocess.Popen(command, env=env, cwd=ROOT, stdout=log, stderr=log))
            )
    return procs


async def race_unique(work: Workload, profile: Profile, env: dict[str, str], workdir: Path) -> None:
    """The unique race: ``racers`` processes enqueue the same ``race_keys``
    unique tasks at once (see :mod:`tools.chaos.race`), through the run's
    faults. What each was answered goes to ``work.races``, and the tasks to
    the workload (each must succeed with its key's number)."""
    procs = spawn_racers(profile, env, workdir)
    for out, proc in procs:
        code = await asyncio.to_thread(proc.wait)
        answers = json.loads(out.read_text()) if code == 0 and out.exists() else None
        work.races.append({int(k): i for k, i in answers.items()} if answers else None)
    ids = sorted({(k, i) for answers in work.races if answers for k, i in answers.items()})
    work.add([i for _, i in ids], [k for k, _ in ids])


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
    redis: RedisServer | None = None,
) -> Report:
    """One chaos run in a fresh store; the checker's report (also written to
    ``workdir/report.json``). On Redis, ``redis`` is the server ``url``
    names, run for this run alone (see :func:`redis_store`): the
    ``restart`` scenario restarts it."""
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}: one of {', '.join(SCENARIOS)}")
    if SCENARIOS[scenario].server and url.startswith("sqlite"):
        raise ValueError(f"the {scenario!r} scenario needs a server: PostgreSQL or Redis")
    if scenario == "restart" and url.startswith("redis") and redis is None:
        raise ValueError("the 'restart' scenario on Redis needs the run's own RedisServer")
    rng = random.Random(seed)
    await asyncio.to_thread(workdir.mkdir, parents=True, exist_ok=True)
    ledger = workdir / "ledger.jsonl"
    path = os.pathsep.join([str(ROOT / "src"), str(ROOT)])  # this checkout's conveyor
    env = {**os.environ, "CONVEYOR_URL": url, LEDGER_ENV: str(ledger), "PYTHONPATH": path}
    if schema is not None:
        env["CONVEYOR_SCHEMA"] = schema
    if SCENARIOS[scenario].bouncer and not url.startswith("postgres"):
        raise ValueError(f"the {scenario!r} scenario needs PostgreSQL")
    proxy = bouncer = None
    if SCENARIOS[scenario].proxy:
        proxy = Proxy(url)
        proxy.start()
        env["CONVEYOR_URL"] = proxy.url
    if SCENARIOS[scenario].bouncer:
        bouncer = Bouncer(url)
        bouncer.start()
        env["CONVEYOR_URL"] = bouncer.url
    try:
        return await _run(
            url, scenario, workdir, profile, schema, rng, env, proxy, log, redis, bouncer
        )
    finally:
        if proxy is not None:
            proxy.stop()
        if bouncer is not None:
            bouncer.close()


async def _fault_window(
    client: App,
    workers: Workers,
    fault: Fault | None,
    rng: random.Random,
    background: Sequence[asyncio.Task[Any]],
    scenario: str,
    log: Callable[[str], None],
) -> float:
    """Apply ``fault`` every fault interval until the work is done or the
    profile's fault seconds are over, replacing the workers that exit on
    their own meanwhile; return the seconds it lasted."""
    profile = workers.profile
    started = time.monotonic()
    while time.monotonic() - started < profile.fault_seconds:
        if await unfinished(client) == 0 and all(b.done() for b in background):
            break
        for pid, code in workers.replace_exited():
            log(f"{scenario}: worker pid {pid} exited with code {code}; replaced")
        if fault is not None:
            await fault(workers, rng)
        await asyncio.sleep(profile.fault_interval)
    return time.monotonic() - started


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
    redis: RedisServer | None,
    bouncer: Bouncer | None = None,
) -> Report:
    chosen = SCENARIOS[scenario]
    fault = chosen.fault
    ledger = Path(env[LEDGER_ENV])
    client = App(url, schema=schema, allow_unregistered=True)
    async with client:
        work = await enqueue(client, profile, rng, chosen.cpu)
        log(f"{scenario}: {len(work.ids)} tasks enqueued; {profile.workers} workers")
        workers = Workers(env, profile, workdir, proxy)
        workers.redis = redis
        workers.bouncer = bouncer
        if fault is restart_database and redis is None:
            workers.cluster = local_cluster(url)
        for _ in range(profile.workers):
            workers.spawn()
        initial = profile.workers
        background = [
            asyncio.create_task(send_mail(client, work, profile)),
            asyncio.create_task(race_unique(work, profile, env, workdir)),
        ]
        if chosen.cpu:
            background.append(asyncio.create_task(hold_gil_in_threads(client, work, profile)))
        try:
            seconds = await _fault_window(client, workers, fault, rng, background, scenario, log)
            log(f"{scenario}: faults over after {seconds:.1f}s; settling")
            if proxy is not None:
                proxy.restore()
            workers.heal()
            await asyncio.gather(*background)
            settled = await wait_until_done(client, profile.settle_seconds)
            log(f"{scenario}: {'settled' if settled else 'NOT settled'}")
        finally:
            for job in background:
                job.cancel()
            await asyncio.to_thread(workers.stop_all, workers.exit_bound())
        work.close(profile.children)
        tasks = await _stored(client, work.ids)
        # The gathers' children: checked like every task, though not enqueued here.
        children = await client.list_tasks_async(name=TASK_NAME, limit=len(tasks) + 10_000)
        extra = [t.id for t in children if t.parent_id is not None]
        tasks.update(await _stored(client, extra))
        # The schedule's slots: checked like every task, and each slot once.
        fired = await client.list_tasks_async(name=TICK_NAME, limit=100_000)
        ticks = await _stored(client, [t.id for t in fired])
        tasks.update(ticks)
        raced = await client.list_tasks_async(name=RACE_NAME, limit=100_000)
        races = await _stored(client, [t.id for t in raced])
        tasks.update(races)
        if schema is not None:  # a throwaway schema; a SQLite file stays in workdir
            await (await client.backend()).destroy()
    report = check(
        enqueued=work.ids,
        tasks=tasks,
        ledger=read_ledger(_lines(ledger)),
        faults=read_events(_lines(workers.faults)),
        lease=profile.lease,
        poll_interval=profile.poll_interval,
        control=scenario == "control",
        initial_workers=initial,
        single_writer=url.startswith("sqlite"),
        expected=work.expected,
        ticks=list(ticks.values()),
        tick_seconds=TICK_SECONDS,
        races=list(races.values()),
        race_answers=work.races,
        race_keys=profile.race_keys,
        chords=work.chords,
    )
    (workdir / "report.json").write_text(json.dumps(report.to_json(), indent=2))
    for task in tasks.values():
        if task.state is TaskState.FAILED:
            last = task.last_attempt
            reason = f"{last.outcome}: {last.error_type}: {last.error_message}" if last else "-"
            log(f"{scenario}: task {task.id} failed after {task.attempt} attempts ({reason})")
    return report


async def _stored(client: App, ids: Sequence[int]) -> dict[int, Task]:
    tasks: dict[int, Task] = {}
    for task_id in ids:
        found = await client.get_async(task_id)
        if found is not None:
            tasks[task_id] = found
    return tasks


def _lines(path: Path) -> Sequence[str]:
    return path.read_text().splitlines() if path.exists() else []
