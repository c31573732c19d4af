"""Why a task is not running (or what it is doing): :func:`explain`.

One sentence and the facts behind it, read from the store: the task, the
pauses, the workers, and its concurrency key. The reasons, in the order
they are checked (the first that holds is the answer):

============================  ================================================
reason                        when
============================  ================================================
``missing``                   no task has this id (never, or deleted/pruned)
``finished``                  it succeeded, failed or was cancelled: how
``running``                   a worker holds its lease: who, until when, and
                              whether that worker still heartbeats
``dependencies``              waiting for tasks it depends on (``after``):
                              which ones have not ended, and how each stands
``waiting``                   a coroutine waiting for a message
``not_due``                   due later: a delay, a retry's back-off, a snooze
                              or a coroutine's sleep (which one, until when)
``paused``                    its queue or its task name is paused
``no_worker``                 no live worker serves both its name and queue
``concurrency``               its concurrency key runs as many tasks as it may
                              (the ids of those running)
``rate_limited``              its rate key has no token until a given time
``due``                       due now, nothing holds it back: a worker will
                              claim it when a slot frees
============================  ================================================

Limits: an explanation is a snapshot of several reads, not one transaction,
so a task may move on between them; times are the store's. A live worker
is one heard from within three of its beat intervals
(:meth:`~conveyor.records.WorkerInfo.live`); a worker registered
without its task names (an older release) is taken to serve every name of
its queues.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from conveyor.backends.capabilities import Inspector
from conveyor.backends.protocol import Backend
from conveyor.model import Outcome, PauseKind, Progress, Task, TaskState, findable
from conveyor.records import WorkerInfo

RETRIED = (Outcome.FAILED, Outcome.TIMED_OUT, Outcome.LEASE_LOST, Outcome.INTERRUPTED)
"""How an attempt ends whose task is then due again after a back-off."""
REASONS = (
    "missing",
    "finished",
    "running",
    "dependencies",
    "waiting",
    "not_due",
    "paused",
    "no_worker",
    "concurrency",
    "rate_limited",
    "due",
)


@dataclass(frozen=True, slots=True)
class Explanation:
    """Why task ``task_id`` is where it is: ``reason`` (one of
    :data:`REASONS`), a sentence for people, and the facts behind it (JSON
    values: times as ISO 8601 text)."""

    task_id: int
    reason: str
    sentence: str
    facts: dict[str, Any] = field(default_factory=dict)


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


def _seconds(delta: timedelta) -> float:
    return round(delta.total_seconds(), 3)


async def explain(
    backend: Backend, inspector: Inspector, task_id: int, now: datetime
) -> Explanation:
    """Explain task ``task_id`` as the store has it at ``now`` (the store's clock)."""
    task = await backend.get_task(task_id, with_attempts=True) if findable(task_id) else None
    if task is None:
        return Explanation(task_id, "missing", f"No task {task_id}: never stored, or deleted.")
    facts = _facts(task)
    if task.waiting_for is not None:
        facts["dependencies"] = [
            {"id": d.task_id, "name": d.name, "state": d.state.value if d.state else None}
            for d in await backend.dependencies(task_id)
        ]
    if task.state.is_terminal:
        return _finished(task, facts)
    if task.state is TaskState.IN_PROGRESS:
        return _running(task, await inspector.list_workers(), now, facts)
    if task.state is TaskState.WAITING and task.waiting_for:
        return _dependencies(task, facts)
    if task.state is TaskState.WAITING:
        return Explanation(
            task_id,
            "waiting",
            f"Task {task_id} waits for a message in its inbox; a send wakes it.",
            facts,
        )
    if task.run_at > now:
        return _not_due(task, now, facts)
    paused = await _paused(backend, task)
    if paused is not None:
        kind, name = paused
        facts["paused"] = {"kind": kind, "name": name}
        return Explanation(
            task_id,
            "paused",
            f"Task {task_id} is due, but its {kind} {name!r} is paused: resume it to run.",
            facts,
        )
    alive = [w for w in await inspector.list_workers() if w.live(now)]
    serving = [w.id for w in alive if w.serves(task.name, task.queue)]
    facts["live_workers"] = {
        w.id: {"queues": list(w.queues), "tasks": list(w.tasks)} for w in alive
    }
    if not serving:
        return Explanation(
            task_id,
            "no_worker",
            f"Task {task_id} is due, but no live worker serves task {task.name!r} "
            f"in queue {task.queue!r} "
            + (
                f"({len(alive)} live worker(s) serve other queues or tasks)."
                if alive
                else "(no worker is live)."
            ),
            facts,
        )
    facts["serving_workers"] = serving
    if task.concurrency_key is not None:
        held = await _held(inspector, task, now, facts)
        if held is not None:
            return held
    return Explanation(
        task_id,
        "due",
        f"Task {task_id} is due and nothing holds it back: one of {len(serving)} "
        "worker(s) serving it will claim it when a slot frees (tasks of higher "
        "priority, or due earlier, go first).",
        facts,
    )


def _facts(task: Task) -> dict[str, Any]:
    """The facts of every explanation: the task's state, name, queue and
    attempts, and its latest progress report if it has one."""
    facts: dict[str, Any] = {
        "state": task.state.value,
        "name": task.name,
        "queue": task.queue,
        "attempt": task.attempt,
        "max_attempts": task.max_attempts,
    }
    if task.progress is not None:
        facts["progress"] = _progress(task.progress)
    return facts


def _progress(progress: Progress) -> dict[str, Any]:
    return {
        "done": progress.done,
        "total": progress.total,
        "note": progress.note,
        "attempt": progress.attempt,
        "at": _iso(progress.at),
    }


def _finished(task: Task, facts: dict[str, Any]) -> Explanation:
    last = task.last_attempt
    facts["finished_at"] = _iso(task.finished_at)
    how = f"{task.state.value} at {_iso(task.finished_at)}"
    if last is not None and last.outcome is not Outcome.SUCCEEDED:
        facts["last_error"] = {"type": last.error_type, "message": last.error_message}
        if last.error_type:
            how += f" after attempt {last.number} ({last.error_type}: {last.error_message})"
    ended_by = [d for d in facts.get("dependencies", ()) if d["state"] in ("failed", "cancelled")]
    if last is None and task.state is not TaskState.SUCCEEDED and ended_by:
        first = ended_by[0]
        how += f" without running: its dependency {first['id']} ended {first['state']}"
    sentence = f"Task {task.id} finished: {how}."
    if task.progress is not None and task.state is not TaskState.SUCCEEDED:
        sentence += f" Its last progress report: {task.progress.summary()}."
    return Explanation(task.id, "finished", sentence, facts)


def _dependencies(task: Task, facts: dict[str, Any]) -> Explanation:
    listed = facts.get("dependencies", [])
    facts["waiting_for"] = task.waiting_for
    unended = [d for d in listed if d["state"] not in ("succeeded", "failed", "cancelled")]
    shown = ", ".join(f"{d['id']} ({d['state'] or 'deleted'})" for d in unended[:5])
    more = f" and {len(unended) - 5} more" if len(unended) > 5 else ""
    sentence = (
        f"Task {task.id} waits for {task.waiting_for} of its {len(listed)} dependencies "
        f"to end: {shown}{more}; it becomes due when the last of them ends."
    )
    return Explanation(task.id, "dependencies", sentence, facts)


def _running(
    task: Task, workers: list[WorkerInfo], now: datetime, facts: dict[str, Any]
) -> Explanation:
    worker = next((w for w in workers if w.id == task.worker_id), None)
    beating = worker is not None and worker.live(now)
    expires = task.lease_expires_at
    left = _seconds(expires - now) if expires is not None else None
    facts.update(
        worker_id=task.worker_id,
        lease_expires_at=_iso(expires),
        lease_seconds_left=left,
        worker_heartbeats=beating,
        worker_last_seen_at=_iso(worker.last_seen_at) if worker else None,
    )
    if beating:
        tail = "which still heartbeats"
    elif left is not None and left < 0:
        tail = "which stopped heartbeating: its lease has expired and the next claim takes it back"
    else:
        tail = "which has stopped heartbeating: the task is reclaimed when its lease expires"
    lease = f"its lease ends in {left:g}s" if left is not None and left >= 0 else "its lease ended"
    sentence = (
        f"Task {task.id} runs attempt {task.attempt} on worker {task.worker_id}, {tail}; {lease}."
    )
    if task.progress is not None and task.progress.attempt == task.attempt:
        since = _seconds(now - task.progress.at)
        sentence += f" It reported progress {task.progress.summary()} {since:g}s ago."
    if task.cancel_requested:
        sentence += " Its cancel was requested: the worker stops it at its next heartbeat."
    return Explanation(task.id, "running", sentence, facts)


def _not_due(task: Task, now: datetime, facts: dict[str, Any]) -> Explanation:
    wait = _seconds(task.run_at - now)
    facts.update(run_at=_iso(task.run_at), seconds_left=wait)
    last = task.last_attempt
    if last is None:
        why, cause = "the delay it was enqueued with", "delay"
    elif (last.error_type or "").endswith(".Snooze"):
        why, cause = f"a snooze at attempt {last.number}", "snooze"
    elif last.outcome in RETRIED:
        why, cause = f"a retry's back-off after attempt {last.number} {last.outcome.value}", "retry"
    elif task.inbox:
        why, cause = "its coroutine's sleep", "sleep"
    elif task.step is not None:
        why, cause = f"the wait its workflow set before step {task.step!r}", "step_delay"
    else:
        why, cause = "the time it was given", "delay"
    facts["cause"] = cause
    sentence = f"Task {task.id} is not due until {_iso(task.run_at)} (in {wait:g}s): {why}."
    return Explanation(task.id, "not_due", sentence, facts)


async def _paused(backend: Backend, task: Task) -> tuple[str, str] | None:
    for pause in await backend.list_pauses():
        if pause.kind is PauseKind.QUEUE and pause.name == task.queue:
            return "queue", task.queue
        if pause.kind is PauseKind.TASK and pause.name == task.name:
            return "task", task.name
    return None


async def _held(
    inspector: Inspector, task: Task, now: datetime, facts: dict[str, Any]
) -> Explanation | None:
    key = task.concurrency_key
    assert key is not None
    info = next((k for k in await inspector.list_keys(now=now) if k.key == key), None)
    if info is None:
        return None
    facts["concurrency_key"] = info.as_json()
    if info.running >= info.max_running:
        holders = await inspector.key_holders(key)
        facts["held_by"] = holders
        ids = ", ".join(str(i) for i in holders) or "none visible"
        return Explanation(
            task.id,
            "concurrency",
            f"Task {task.id} is due, but its concurrency key {key!r} already runs "
            f"{info.running} of {info.max_running} task(s) (held by {ids}).",
            facts,
        )
    if info.next_start_at is not None and info.next_start_at > now:
        return Explanation(
            task.id,
            "rate_limited",
            f"Task {task.id} is due, but its rate key {key!r} ({info.rate_limit} per "
            f"{info.rate_period:g}s) has no token until {_iso(info.next_start_at)}.",
            facts,
        )
    return None
