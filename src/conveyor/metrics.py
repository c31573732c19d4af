"""Prometheus metrics of one process, built on its events (the ``metrics``
extra: ``pip install 'conveyor[metrics]'``, prometheus-client).

``Metrics().observe(app.events)`` counts what this process's client and
workers do; ``track(worker)`` adds the worker's running attempts and free
slots as gauges, read at each scrape; ``serve(port)`` answers scrapes on
``http://ADDR:PORT/metrics`` from a thread (``conveyor worker
--metrics-port``). Every metric is named ``conveyor_…``:

======================================  =========  ==========================
metric                                  type       labels
======================================  =========  ==========================
``tasks_enqueued_total``                counter    name, queue
``attempts_started_total``              counter    name, queue
``attempts_ended_total``                counter    name, queue, outcome
``attempts_retried_total``              counter    name, queue
``leases_lost_total``                   counter    name, queue
``attempt_duration_seconds``            histogram  name, queue
``start_delay_seconds``                 histogram  name, queue
``claims_total``                        counter    result (tasks, empty, failed)
``attempts_handed_off_total``           counter    name, queue
``claim_duration_seconds``              histogram  (none)
``schedules_fired_total``               counter    schedule
``worker_running_attempts``             gauge      worker
``worker_free_slots``                   gauge      worker
======================================  =========  ==========================

``outcome`` is how an attempt ended (succeeded, failed, timed_out,
cancelled, lease_lost, interrupted); a retried attempt is also counted in
``attempts_retried_total``; an attempt its enqueue leased to an idle
worker, started without a claim (PostgreSQL's hand-offs), also in
``attempts_handed_off_total``. ``start_delay_seconds`` runs from when a task
was due (its enqueue, its retry time) to its attempt's start. These are one
process's figures: a scrape of every worker, summed, is the fleet's. The
store's own figures (tasks by state and queue, due tasks and the oldest
due task's age per queue, live workers) are :class:`StoreMetrics`, served
by ``conveyor exporter`` (one scrape for the whole system).
Labels come from task names and queues, which an app declares: their
number stays bounded.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from conveyor.errors import ConfigurationError
from conveyor.events import (
    AttemptEnded,
    AttemptStarted,
    ClaimReturned,
    Event,
    EventBus,
    LeaseLost,
    ProgressStored,
    ScheduleFired,
    TaskEnqueued,
)
from conveyor.model import Outcome, TaskState

try:
    from prometheus_client import (
        CollectorRegistry,
        Counter,
        Gauge,
        Histogram,
        start_http_server,
    )
    from prometheus_client.core import GaugeMetricFamily, Metric
    from prometheus_client.registry import Collector
except ModuleNotFoundError as exc:  # pragma: no cover - exercised without the extra
    if (exc.name or "").partition(".")[0] != "prometheus_client":
        raise
    raise ConfigurationError(
        "metrics need prometheus-client: pip install 'conveyor[metrics]'"
    ) from None

if TYPE_CHECKING:
    from conveyor.client import Client
    from conveyor.worker import Worker

DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 1800, 3600)
"""Seconds, for attempt durations: from a no-op to an hour."""
DELAY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5, 30, 60, 300)
"""Seconds, for the wait from due to start: a healthy queue lives in the first few."""
CLAIM_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5)


def serve(registry: CollectorRegistry, port: int, addr: str) -> None:
    """Answer scrapes of ``registry`` on ``http://ADDR:PORT/metrics`` from a
    daemon thread. Raises ConfigurationError when the address cannot be
    bound (a port in use, an address not of this machine)."""
    try:
        start_http_server(port, addr, registry=registry)
    except OSError as exc:
        raise ConfigurationError(f"cannot serve metrics on {addr}:{port}: {exc}") from exc


class Metrics:
    """One process's conveyor metrics in a Prometheus registry (its own
    unless given one, e.g. ``prometheus_client.REGISTRY``)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        task = ("name", "queue")
        r = self.registry
        self.enqueued = Counter(
            "conveyor_tasks_enqueued", "Tasks stored by this process.", task, registry=r
        )
        self.started = Counter(
            "conveyor_attempts_started", "Attempts started by this process.", task, registry=r
        )
        self.ended = Counter(
            "conveyor_attempts_ended",
            "Attempts ended in this process, by outcome.",
            (*task, "outcome"),
            registry=r,
        )
        self.retried = Counter(
            "conveyor_attempts_retried",
            "Attempts that ended with their task due again.",
            task,
            registry=r,
        )
        self.lost = Counter(
            "conveyor_leases_lost", "Leases this process's workers lost.", task, registry=r
        )
        self.duration = Histogram(
            "conveyor_attempt_duration_seconds",
            "How long attempts ran.",
            task,
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.delay = Histogram(
            "conveyor_start_delay_seconds",
            "From when a task was due to its attempt's start.",
            task,
            buckets=DELAY_BUCKETS,
            registry=r,
        )
        self.claims = Counter(
            "conveyor_claims", "Claims sent, by what came back.", ("result",), registry=r
        )
        self.handed_off = Counter(
            "conveyor_attempts_handed_off",
            "Attempts started without a claim: their enqueue leased them to the worker.",
            task,
            registry=r,
        )
        self.claim_duration = Histogram(
            "conveyor_claim_duration_seconds",
            "How long a claim took, sent to returned.",
            buckets=CLAIM_BUCKETS,
            registry=r,
        )
        self.progress = Counter(
            "conveyor_progress_stored",
            "Progress reports this process's workers stored (at most one per "
            "attempt and progress interval).",
            task,
            registry=r,
        )
        self.fired = Counter(
            "conveyor_schedules_fired", "Schedule runs fired here.", ("schedule",), registry=r
        )
        self._workers = _Workers()
        self.registry.register(self._workers)
        self._by_task: dict[tuple[str, str], _TaskSeries] = {}

    def observe(self, events: EventBus) -> Callable[[], None]:
        """Count ``events`` from now on; returns the function that stops it."""
        return events.subscribe(self.record)

    def track(self, worker: Worker) -> None:
        """Report ``worker``'s running attempts and free slots at each scrape."""
        self._workers.workers.append(worker)

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:  # noqa: S104 - a scrape target
        """Answer scrapes on ``http://ADDR:PORT/metrics`` (see :func:`serve`)."""
        serve(self.registry, port, addr)

    def record(self, event: Event) -> None:
        """Count one event (an :class:`EventBus` callback)."""
        if isinstance(event, AttemptEnded):
            series = self._series(event.name, event.queue)
            ended = series.ended.get(event.outcome)
            if ended is None:
                ended = series.ended[event.outcome] = self.ended.labels(
                    event.name, event.queue, event.outcome.value
                )
            ended.inc()
            series.duration.observe(event.duration)
            if event.state is TaskState.PENDING:
                series.retried.inc()
        elif isinstance(event, AttemptStarted):
            series = self._series(event.name, event.queue)
            series.started.inc()
            if event.delay is not None:
                series.delay.observe(max(event.delay, 0.0))
            if event.handed_off:
                self.handed_off.labels(event.name, event.queue).inc()
        elif isinstance(event, ClaimReturned):
            result = "failed" if event.failed else "tasks" if event.count else "empty"
            self.claims.labels(result).inc()
            self.claim_duration.observe(event.seconds)
        elif isinstance(event, TaskEnqueued):
            self.enqueued.labels(event.name, event.queue).inc(len(event.task_ids))
        elif isinstance(event, LeaseLost):
            self.lost.labels(event.name, event.queue).inc()
        elif isinstance(event, ProgressStored):
            self.progress.labels(event.name, event.queue).inc()
        elif isinstance(event, ScheduleFired):
            self.fired.labels(event.schedule).inc()

    def _series(self, name: str, queue: str) -> _TaskSeries:
        """The labelled series of one task name and queue, looked up once
        (``labels()`` costs more than the increment it serves)."""
        found = self._by_task.get((name, queue))
        if found is None:
            found = self._by_task[(name, queue)] = _TaskSeries(
                started=self.started.labels(name, queue),
                retried=self.retried.labels(name, queue),
                duration=self.duration.labels(name, queue),
                delay=self.delay.labels(name, queue),
            )
        return found


@dataclass(slots=True)
class _TaskSeries:
    """The series an attempt of one task name and queue updates."""

    started: Counter
    retried: Counter
    duration: Histogram
    delay: Histogram
    ended: dict[Outcome, Counter] = field(default_factory=dict)


class StoreMetrics:
    """Gauges of the store itself, for the whole system in one scrape:
    tasks by state and queue, each queue's due and later tasks and the age
    of its oldest due task, the live workers and their slots. Set by
    :meth:`refresh` (which reads the store: the counts walk every task, so
    refresh every 15 s or more on a large store), served by
    ``conveyor exporter`` and by a dashboard's ``/metrics``."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.tasks = Gauge(
            "conveyor_store_tasks", "Tasks in the store.", ("state", "queue"), registry=r
        )
        self.due = Gauge(
            "conveyor_queue_due_tasks", "Pending tasks due now.", ("queue",), registry=r
        )
        self.later = Gauge(
            "conveyor_queue_later_tasks", "Pending tasks due later.", ("queue",), registry=r
        )
        self.oldest = Gauge(
            "conveyor_queue_oldest_due_seconds",
            "How long the oldest due task of a queue has waited (0: none due).",
            ("queue",),
            registry=r,
        )
        self.workers = Gauge("conveyor_live_workers", "Live workers.", registry=r)
        self.slots = Gauge("conveyor_live_worker_slots", "Slots of the live workers.", registry=r)
        self.read_seconds = Gauge(
            "conveyor_store_read_seconds", "How long the last refresh took.", registry=r
        )
        self.up = Gauge(
            "conveyor_store_up", "1 if the last refresh read the store, else 0.", registry=r
        )

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:  # noqa: S104 - a scrape target
        """Answer scrapes on ``http://ADDR:PORT/metrics`` (see :func:`serve`)."""
        serve(self.registry, port, addr)

    async def refresh(self, client: Client) -> None:
        """Read ``client``'s store (its clock, counts, backlogs, workers:
        :meth:`~conveyor.Client.overview_async`) and set every gauge."""
        started = time.monotonic()
        found = await client.overview_async()
        now, live = found.now, found.live_workers
        by_state: dict[tuple[str, str], int] = {}
        for count in found.counts:
            key = (count.state.value, count.queue)
            by_state[key] = by_state.get(key, 0) + count.count
        for gauge in (self.tasks, self.due, self.later, self.oldest):
            gauge.clear()  # a queue that emptied leaves no stale series
        for (state, queue), value in by_state.items():
            self.tasks.labels(state, queue).set(value)
        for backlog in found.backlogs:
            self.due.labels(backlog.queue).set(backlog.due)
            self.later.labels(backlog.queue).set(backlog.later)
            waited = (now - backlog.oldest_due_at).total_seconds() if backlog.oldest_due_at else 0
            self.oldest.labels(backlog.queue).set(max(waited, 0.0))
        self.workers.set(len(live))
        self.slots.set(sum(w.concurrency for w in live))
        self.read_seconds.set(time.monotonic() - started)
        self.up.set(1)


class _Workers(Collector):
    """The tracked workers' gauges, read when scraped."""

    def __init__(self) -> None:
        self.workers: list[Worker] = []

    def collect(self) -> Iterator[Metric]:
        running = GaugeMetricFamily(
            "conveyor_worker_running_attempts", "Attempts a worker runs now.", labels=["worker"]
        )
        free = GaugeMetricFamily(
            "conveyor_worker_free_slots", "Slots a worker has free now.", labels=["worker"]
        )
        labels = ["worker", "name", "queue"]
        done = GaugeMetricFamily(
            "conveyor_worker_progress_done",
            "The summed progress done of a worker's running attempts of one task name "
            "that reported a total (divide by conveyor_worker_progress_total).",
            labels=labels,
        )
        total = GaugeMetricFamily(
            "conveyor_worker_progress_total",
            "The summed progress total of a worker's running attempts of one task name "
            "that reported one.",
            labels=labels,
        )
        for worker in self.workers:
            busy = worker.running_count
            running.add_metric([worker.id], busy)
            free.add_metric([worker.id], max(worker.config.concurrency - busy, 0))
            for (name, queue), (so_far, of) in worker.progress_by_task().items():
                done.add_metric([worker.id, name, queue], so_far)
                total.add_metric([worker.id, name, queue], of)
        yield running
        yield free
        yield done
        yield total
