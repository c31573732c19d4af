"""The worker registry in memory: register, stop (the reads are in
:mod:`.reads`)."""

from __future__ import annotations

import dataclasses
from datetime import datetime

from conveyor.backends.memory.schema import Tables
from conveyor.records import WorkerInfo


class Workers(Tables):
    """``register_worker`` and ``stop_worker``."""

    def register_worker(self, info: WorkerInfo, now: datetime) -> None:
        with self.lock:
            self.workers[info.id] = dataclasses.replace(
                info, started_at=now, last_seen_at=now, stopped_at=None
            )

    def stop_worker(self, worker_id: str, now: datetime) -> None:
        with self.lock:
            found = self.workers.get(worker_id)
            if found is not None:
                self.workers[worker_id] = dataclasses.replace(
                    found, stopped_at=now, last_seen_at=now
                )
