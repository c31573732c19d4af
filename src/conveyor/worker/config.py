"""Worker settings, with their documented defaults as named constants."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from conveyor.errors import ConfigurationError
from conveyor.model import (
    DEFAULT_LEASE_SECONDS,
    MIN_LEASE_SECONDS,
    check_duration,
    check_name,
)
from conveyor.retention import DEFAULT_RETENTION, Retention

DEFAULT_CONCURRENCY = 10
DEFAULT_POLL_INTERVAL = 1.0
"""Seconds between claims when no wake-up arrives (delayed tasks, reclaims)."""
MIN_POLL_INTERVAL = 0.001
DEFAULT_GRACE = 30.0
"""Seconds a shutdown lets running handlers drain before ordering them to stop."""
DEFAULT_STOP_TIMEOUT = 10.0
"""Seconds a shutdown waits for handlers told to stop (their leases still
renewed) before it gives them up (their leases are then left to expire)."""
HEARTBEATS_PER_LEASE = 3
"""Renewals per lease: the heartbeat beats every third of the shortest lease."""
MIN_BEAT = 0.05
"""Seconds: the heartbeat never beats more often than this."""


def beat_interval(lease: float, interval: float | None) -> float:
    """Seconds between heartbeats for leases of ``lease`` seconds: a third of
    it (at least ``MIN_BEAT``), or the configured ``interval`` if shorter."""
    natural = max(lease / HEARTBEATS_PER_LEASE, MIN_BEAT)
    return natural if interval is None else min(interval, natural)


DEFAULT_PROGRESS_INTERVAL = 1.0
"""Seconds between two writes of a worker's progress reports."""
MIN_PROGRESS_INTERVAL = 0.01

MIN_POOL_SIZE = 10
MAX_DEFAULT_POOL_SIZE = 44


@dataclass(frozen=True)
class WorkerConfig:
    """How one worker process runs.

    ``queues`` None serves every queue the app's tasks use. ``lease`` is the
    lease of tasks that set none; the heartbeat renews every
    ``heartbeat_interval`` seconds (default: the shortest held lease / 3).
    ``burst`` exits once no task of its queues is due or running.
    ``pool_size`` bounds the worker's database connections; attempt
    transactions hold one each while their handler runs, so handlers beyond
    the pool wait for a connection.
    """

    concurrency: int = DEFAULT_CONCURRENCY
    queues: Sequence[str] | None = None
    lease: float = DEFAULT_LEASE_SECONDS
    heartbeat_interval: float | None = None
    poll_interval: float = DEFAULT_POLL_INTERVAL
    grace: float = DEFAULT_GRACE
    stop_timeout: float = DEFAULT_STOP_TIMEOUT
    burst: bool = False
    handle_signals: bool = True
    worker_id: str | None = None
    pool_size: int | None = None
    work_connections: int = 1
    """PostgreSQL server connections for the worker's own statements
    (completions, progress, maintenance); LISTEN, wake-up turns and
    heartbeats share one more, the session connection, on a thread of its
    own, which with 1 carries the claims too. Handlers' own transactions
    borrow others only while they run. So a worker process holds
    ``work_connections + 1`` (see :mod:`conveyor.backends.postgres.pools`
    and docs/scaling.md for what 2 or more buys)."""
    log_attempts: bool = True
    """Log each finished attempt at INFO with its duration (else at DEBUG)."""
    retention: Retention | None = DEFAULT_RETENTION
    """How long finished tasks and stopped workers are kept (see
    :class:`Retention`); None: this worker never prunes."""
    schedules: bool = True
    """Sync the app's schedules at start and fire them (False: this worker
    leaves schedules to other workers)."""
    wakeup_turns: bool = True
    """Take turns with the idle workers of the same queues and tasks at
    answering wake-ups, so that a task costs about one claim across a fleet
    (PostgreSQL; see :mod:`conveyor.worker.turns`). False: answer each."""
    handoffs: bool = True
    """While idle, offer up to half the slots for enqueues to fill directly:
    a task enqueued alone then starts after one commit, not two (PostgreSQL;
    see :mod:`conveyor.worker.standby`). False: claim every task."""
    progress_interval: float = DEFAULT_PROGRESS_INTERVAL
    """Seconds between two writes of the running attempts' progress reports
    (``TaskContext.progress``): each write carries the latest report of
    every attempt that reported since the last."""
    process_pool: int | None = None
    """Idle handler processes kept for the next ``process=True`` attempt
    (None: the machine's CPU count; 0: a fresh process per attempt). See
    :mod:`conveyor.worker.processes`."""

    def kept_processes(self) -> int:
        """How many idle handler processes this worker keeps."""
        if self.process_pool is not None:
            return self.process_pool
        return os.cpu_count() or 1

    def connections(self) -> int:
        """Pool size: ``pool_size``, else room for claims, completions and one
        attempt transaction per slot, within reason (at most 44)."""
        if self.pool_size is not None:
            return self.pool_size
        return max(MIN_POOL_SIZE, min(self.concurrency + 4, MAX_DEFAULT_POOL_SIZE))

    def longest_beat(self) -> float:
        """The longest pause between two heartbeats: the interval, or a third
        of the lease (a task's shorter lease shortens it)."""
        return beat_interval(self.lease, self.heartbeat_interval)

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ConfigurationError("concurrency must be at least 1")
        if self.work_connections < 1:
            raise ConfigurationError("work_connections must be at least 1")
        if self.queues is not None:
            if isinstance(self.queues, str):
                raise ConfigurationError("queues must be a sequence of queue names, not a string")
            for queue in self.queues:
                check_name("a worker's queue", queue)
        check_duration("lease", self.lease, minimum=MIN_LEASE_SECONDS)
        if self.heartbeat_interval is not None and not 0 < self.heartbeat_interval < self.lease:
            raise ConfigurationError(
                "heartbeat_interval must be positive and shorter than the lease"
            )
        check_duration("poll_interval", self.poll_interval, minimum=MIN_POLL_INTERVAL)
        check_duration("grace", self.grace)
        check_duration("stop_timeout", self.stop_timeout)
        check_duration("progress_interval", self.progress_interval, MIN_PROGRESS_INTERVAL)
        if self.process_pool is not None and (
            isinstance(self.process_pool, bool)
            or not isinstance(self.process_pool, int)
            or self.process_pool < 0
        ):
            raise ConfigurationError("process_pool must be None or an int of at least 0")
        if self.retention is not None and not isinstance(self.retention, Retention):
            raise ConfigurationError("retention must be a conveyor.Retention or None")
