"""The worker runtime: claim loop, heartbeat, executors, batched completions."""

from conveyor.worker.config import WorkerConfig
from conveyor.worker.worker import Worker

__all__ = ["Worker", "WorkerConfig"]
