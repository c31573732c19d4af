"""Prometheus metrics (conveyor.metrics): a worker's events counted, on every
backend; the gauges read at a scrape; and ``conveyor worker --metrics-port``
scraped over HTTP while a real worker process drains."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

import conveyor
from conveyor.metrics import Metrics, StoreMetrics
from conveyor.model import RetryPolicy
from conveyor.records import WorkerInfo
from tests.cli_harness import ROOT, Cli
from tests.worker.helpers import RunningWorker, wait_for, wait_terminal
from tools.redis_server import free_port

APP = "tests.apps.cli_app:app"


@pytest.fixture
def app(any_app: conveyor.App) -> conveyor.App:
    return any_app


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> Samples:
    """Every sample of a scrape's text, by name and sorted labels."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def samples(metrics: Metrics | StoreMetrics) -> Samples:
    """Every sample of a scrape of ``metrics``'s registry."""
    return parse(generate_latest(metrics.registry).decode())


async def test_a_worker_s_attempts_counted(app: conveyor.App) -> None:
    metrics = Metrics()
    metrics.observe(app.events)
    release = asyncio.Event()

    @app.task(retry=RetryPolicy(max_attempts=2, initial_interval=0.01, max_interval=0.01, jitter=0))
    async def job(n: int) -> int:
        if n < 0:
            raise ValueError("negative")
        return n

    @app.task(timeout=0.1, retry=RetryPolicy(max_attempts=1))
    async def stuck() -> None:
        await asyncio.sleep(30)

    @app.task(queue="slow")
    async def held() -> None:
        await release.wait()

    async with app:
        handles = await app.enqueue_many_async(job, [{"n": n} for n in (1, 2, 3, -1)])
        handles.append(await stuck.enqueue_async())
        waiting = await held.enqueue_async()
        async with RunningWorker(app, queues=["default", "slow"], concurrency=4) as worker:
            metrics.track(worker)
            await wait_terminal(app, [h.id for h in handles])
            await wait_for(lambda: _running(metrics, worker.id))
            during = samples(metrics)
            release.set()
            await wait_terminal(app, [waiting.id])
    got = samples(metrics)

    def at(metric: str, **labels: str) -> float:
        return got[(metric, tuple(sorted(labels.items())))]

    job = {"name": "job", "queue": "default"}
    assert at("conveyor_tasks_enqueued_total", **job) == 4
    assert at("conveyor_attempts_started_total", **job) == 5  # -1 ran twice
    assert at("conveyor_attempts_ended_total", **job, outcome="succeeded") == 3
    assert at("conveyor_attempts_ended_total", **job, outcome="failed") == 2
    assert at("conveyor_attempts_retried_total", **job) == 1
    assert (
        at("conveyor_attempts_ended_total", name="stuck", queue="default", outcome="timed_out") == 1
    )
    assert at("conveyor_attempt_duration_seconds_count", **job) == 5
    assert at("conveyor_start_delay_seconds_count", **job) == 5
    assert at("conveyor_claims_total", result="tasks") >= 1
    # One attempt ran (held) when scraped mid-run, on a worker of four slots.
    worker_labels = (("worker", worker.id),)
    assert during[("conveyor_worker_running_attempts", worker_labels)] == 1
    assert during[("conveyor_worker_free_slots", worker_labels)] == 3


async def test_attempts_handed_off_are_counted(app: conveyor.App) -> None:
    """On PostgreSQL a task enqueued alone to an idle worker is handed off;
    elsewhere every attempt is claimed."""
    metrics = Metrics()
    metrics.observe(app.events)

    @app.task()
    async def job(n: int) -> int:
        return n

    # A lease long enough that no offer renewal (which holds the offer's row,
    # so an enqueue passes it over) falls within the test.
    async with app, RunningWorker(app, concurrency=4, poll_interval=30, lease=120) as worker:
        ids = []
        for n in range(3):
            await wait_for(lambda: _ready(worker))  # an offer stands, no top-up under way
            ids.append((await job.enqueue_async(n=n)).id)
            await wait_terminal(app, ids[-1:])
    got = samples(metrics)
    labels = (("name", "job"), ("queue", "default"))
    assert got[("conveyor_attempts_started_total", labels)] == 3
    handed = got.get(("conveyor_attempts_handed_off_total", labels), 0.0)
    assert handed == worker.handed_off_count
    assert handed == (3 if worker.standby is not None else 0)


async def _ready(worker: conveyor.Worker) -> bool:
    """Offering, where the store has hand-offs; else serving."""
    if worker.standby is None:
        return worker.claims_made > 0
    return worker.standby.standing


async def _running(metrics: Metrics, worker_id: str) -> bool:
    return samples(metrics).get(("conveyor_worker_running_attempts", (("worker", worker_id),))) == 1


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        return parse(reply.read().decode())


def scraped(port: int, key: tuple[str, tuple[tuple[str, str], ...]], value: float) -> Samples:
    """Scrape ``port`` until sample ``key`` reads ``value`` (30 s at most,
    waiting for the process to listen first)."""
    deadline = time.monotonic() + 30
    found: Samples = {}
    while found.get(key) != value:
        assert time.monotonic() < deadline, found
        time.sleep(0.1)
        try:
            found = scrape(port)
        except OSError:
            continue  # not listening yet
    return found


def test_a_worker_process_serves_its_metrics(cli: Cli, tmp_path: Path) -> None:
    port = free_port()
    for n in range(20):
        cli.enqueue("add", {"a": n, "b": 1})
    worker = subprocess.Popen(
        [sys.executable, "-m", "conveyor.cli", "worker", APP, "--metrics-port", str(port)],
        cwd=ROOT,
        env=cli.env,
        stderr=subprocess.DEVNULL,
    )
    try:
        labels = {"name": "add", "queue": "default", "outcome": "succeeded"}
        found = scraped(port, ("conveyor_attempts_ended_total", tuple(sorted(labels.items()))), 20)
        slots = [v for (name, _), v in found.items() if name == "conveyor_worker_free_slots"]
        assert slots == [10]  # the default concurrency, all free once drained
    finally:
        worker.terminate()
        worker.wait(timeout=60)
    assert worker.returncode == 0


def test_a_taken_metrics_port_is_a_one_line_error(cli: Cli) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        error = cli.fails("worker", APP, "--metrics-port", str(port), "--metrics-addr", "127.0.0.1")
    assert f"cannot serve metrics on 127.0.0.1:{port}" in error


async def test_store_gauges_see_the_whole_store(app: conveyor.App) -> None:
    @app.task()
    async def job() -> None:
        return None

    async with app:
        for _ in range(3):
            await job.enqueue_async()
        await job.options(delay=3600).enqueue_async()
        await job.options(queue="mail").enqueue_async()
        backend = await app.backend()
        await backend.register_worker(WorkerInfo("w1", "host", 1, ("default",), 8, tasks=("job",)))
        store = StoreMetrics()
        await store.refresh(app)
        got = samples(store)
        assert got[("conveyor_queue_due_tasks", (("queue", "default"),))] == 3
        assert got[("conveyor_queue_later_tasks", (("queue", "default"),))] == 1
        assert got[("conveyor_queue_oldest_due_seconds", (("queue", "default"),))] >= 0
        assert got[("conveyor_store_tasks", (("queue", "default"), ("state", "pending")))] == 4
        assert got[("conveyor_live_workers", ())] == 1
        assert got[("conveyor_live_worker_slots", ())] == 8
        assert got[("conveyor_store_up", ())] == 1
        # The mail queue empties: its series go at the next refresh.
        [mail] = await app.list_tasks_async(queue="mail")
        await app.cancel_async(mail.id)
        await store.refresh(app)
        got = samples(store)
    assert ("conveyor_queue_due_tasks", (("queue", "mail"),)) not in got
    assert got[("conveyor_store_tasks", (("queue", "mail"), ("state", "cancelled")))] == 1


def test_the_exporter_serves_the_store(cli: Cli) -> None:
    port = free_port()
    for n in range(4):
        cli.enqueue("add", {"a": n, "b": 1})
    exporter = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "conveyor.cli",
            "exporter",
            "--port",
            str(port),
            "--interval",
            "0.5",
        ],
        cwd=ROOT,
        env=cli.env,
        stderr=subprocess.DEVNULL,
    )
    try:
        key = ("conveyor_queue_due_tasks", (("queue", "default"),))
        scraped(port, key, 4)
        cli.enqueue("add", {"a": 9, "b": 9})
        found = scraped(port, key, 5)  # read again at the next interval
        assert found[("conveyor_store_up", ())] == 1
    finally:
        exporter.terminate()
        exporter.wait(timeout=60)
