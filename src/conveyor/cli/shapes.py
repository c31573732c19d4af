"""The documented JSON shapes the commands print with ``--json``."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from conveyor.cli.common import iso
from conveyor.model import Attempt, Message, Pause, Progress, Task, TaskState
from conveyor.records import DependencyRecord, StoredSchedule, TaskSummary, WorkerInfo

WAITS = (TaskState.PENDING, TaskState.WAITING)


def task_json(task: Task, with_attempts: bool) -> dict[str, Any]:
    """The documented JSON shape of a task (``show``, ``tasks``)."""
    data: dict[str, Any] = {
        "id": task.id,
        "name": task.name,
        "queue": task.queue,
        "state": task.state.value,
        "priority": task.priority,
        "run_at": iso(task.run_at),
        "due_at": iso(due_at(task)),
        "result": task.result,
        "payload": task.payload,
        "attempt": task.attempt,
        "max_attempts": task.max_attempts,
        "timeout": task.timeout,
        "lease": task.lease,
        "created_at": iso(task.created_at),
        "finished_at": iso(task.finished_at),
        "worker_id": task.worker_id,
        "lease_expires_at": iso(task.lease_expires_at),
        "cancel_requested": task.cancel_requested,
        "step": task.step,
        "parent_id": task.parent_id,
        "inbox": task.inbox,
        "idempotency_key": task.idempotency_key,
        "waiting_for": task.waiting_for,
        "progress": progress_json(task.progress),
    }
    if with_attempts:
        data["attempts"] = [attempt_json(a) for a in task.attempts]
    return data


def progress_json(progress: Progress | None) -> dict[str, Any] | None:
    """The JSON shape of a task's latest progress report (None: none)."""
    if progress is None:
        return None
    return {
        "done": progress.done,
        "total": progress.total,
        "note": progress.note,
        "attempt": progress.attempt,
        "at": iso(progress.at),
    }


def dependency_json(record: DependencyRecord) -> dict[str, Any]:
    """The JSON shape of one of a task's dependencies (``show``)."""
    return {
        "id": record.task_id,
        "name": record.name,
        "state": record.state.value if record.state is not None else None,
        "settled": record.settled,
    }


def message_json(message: Message) -> dict[str, Any]:
    """The JSON shape of an unread inbox message (``show``)."""
    return {
        "id": message.id,
        "kind": message.kind.value,
        "sender_id": message.sender_id,
        "body": message.body,
        "created_at": iso(message.created_at),
    }


def attempt_json(attempt: Attempt) -> dict[str, Any]:
    return {
        "number": attempt.number,
        "step": attempt.step,
        "worker_id": attempt.worker_id,
        "outcome": attempt.outcome.value,
        "error_type": attempt.error_type,
        "error_message": attempt.error_message,
        "traceback": attempt.traceback,
        "started_at": iso(attempt.started_at),
        "finished_at": iso(attempt.finished_at),
    }


def pause_json(pause: Pause) -> dict[str, Any]:
    """The JSON shape of a pause (``pauses``)."""
    return {"kind": pause.kind.value, "name": pause.name, "paused_at": iso(pause.paused_at)}


def schedule_json(
    row: StoredSchedule, next_slot: datetime | None, last_task: Task | None
) -> dict[str, Any]:
    """The JSON shape of a stored schedule (``schedules``)."""
    return {
        "name": row.name,
        "task": row.task,
        "cron": row.cron,
        "every": row.every,
        "tz": row.tz,
        "missed": row.missed,
        "next_slot": iso(next_slot),
        "last_slot": iso(row.last_slot),
        "last_task_id": row.last_task_id,
        "last_task_state": last_task.state.value if last_task else None,
    }


def due_at(task: Task | TaskSummary) -> datetime | None:
    """When a pending task becomes due (its delay or retry back-off ends), or
    a waiting one wakes without a message; None for other states."""
    return task.run_at if task.state in WAITS else None


def worker_json(worker: WorkerInfo, now: datetime) -> dict[str, Any]:
    return {
        "id": worker.id,
        "host": worker.host,
        "pid": worker.pid,
        "queues": list(worker.queues),
        "tasks": list(worker.tasks),
        "concurrency": worker.concurrency,
        "started_at": iso(worker.started_at),
        "last_seen_at": iso(worker.last_seen_at),
        "stopped_at": iso(worker.stopped_at),
        "live": worker.live(now),
    }
