"""Retention: how long finished tasks and stopped workers are kept.

A :class:`Retention` is what every worker's pruner (:mod:`conveyor.worker.pruner`)
and ``conveyor prune`` apply; ``WorkerConfig(retention=None)`` turns a
worker's pruning off.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from conveyor.errors import ConfigurationError
from conveyor.model import TaskState, check_duration
from conveyor.records import PruneParams

DAY = 86_400.0
DEFAULT_SUCCEEDED = 1 * DAY
DEFAULT_FAILED = 14 * DAY
DEFAULT_CANCELLED = 14 * DAY
DEFAULT_WORKERS = 1 * DAY
DEFAULT_PRUNE_INTERVAL = 60.0
"""Seconds between two prunes of one worker (spread by ±20 %), unless the
last one left a backlog (see :mod:`conveyor.worker.pruner`)."""
DEFAULT_PRUNE_BATCH = 1000
"""Tasks deleted per transaction."""


def _age(name: str, value: float | timedelta | None) -> float | None:
    if isinstance(value, timedelta):
        value = value.total_seconds()
    return check_duration(f"Retention.{name}", value, minimum=1.0)


@dataclass(frozen=True, slots=True, kw_only=True)
class Retention:
    """How long finished tasks (with their attempts and messages) and stopped
    workers are kept, each in seconds or as a timedelta; None keeps them
    forever. Defaults: succeeded tasks 1 day, failed and cancelled 14 days,
    stopped (or silent) workers 1 day. A finished task whose parent is
    still alive is kept until the parent finishes too. Deleting a task ends
    what its idempotency key promised: the same key enqueues anew. Ages are
    measured on the pruning worker's clock against the store's finish
    times: a clock a few seconds off moves a cutoff of days by as much.
    ``interval`` is the pause between one worker's prunes (a prune that
    stopped with a backlog left is followed at once), ``batch`` the tasks
    deleted per transaction."""

    succeeded: float | timedelta | None = DEFAULT_SUCCEEDED
    failed: float | timedelta | None = DEFAULT_FAILED
    cancelled: float | timedelta | None = DEFAULT_CANCELLED
    workers: float | timedelta | None = DEFAULT_WORKERS
    interval: float = DEFAULT_PRUNE_INTERVAL
    batch: int = DEFAULT_PRUNE_BATCH

    def __post_init__(self) -> None:
        for name in ("succeeded", "failed", "cancelled", "workers"):
            object.__setattr__(self, name, _age(name, getattr(self, name)))
        check_duration("Retention.interval", self.interval, minimum=0.01)
        if isinstance(self.batch, bool) or not isinstance(self.batch, int) or self.batch < 1:
            raise ConfigurationError("Retention.batch must be an integer, at least 1")

    def params(
        self, now: datetime, limit: int | None = None, *, workers: bool = True
    ) -> PruneParams:
        """A prune batch at ``now``: each kept age back from it (and no
        workers unless ``workers``)."""
        ages = {
            TaskState.SUCCEEDED: _age("succeeded", self.succeeded),
            TaskState.FAILED: _age("failed", self.failed),
            TaskState.CANCELLED: _age("cancelled", self.cancelled),
        }
        worker_age = _age("workers", self.workers) if workers else None
        return PruneParams(
            before={
                state: now - timedelta(seconds=age)
                for state, age in ages.items()
                if age is not None
            },
            limit=self.batch if limit is None else limit,
            workers_before=None if worker_age is None else now - timedelta(seconds=worker_age),
        )


DEFAULT_RETENTION = Retention()
