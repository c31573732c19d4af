"""What waits to run: :func:`enqueued`, :func:`assert_enqueued`,
:func:`assert_not_enqueued`.

They read the store through the client's list API, so they work on every
backend (memory, SQLite, PostgreSQL) and from sync and async tests alike.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from conveyor import payload as codec
from conveyor.errors import PayloadError
from conveyor.model import Task, TaskState
from conveyor.task import TaskDef

PAGE = 100
"""Tasks read per page of the list API."""
SHOWN = 20
"""Tasks a failure message lists at most."""


async def enqueued_async(task: TaskDef) -> list[Task]:
    """Async form of :func:`enqueued`."""
    found: list[Task] = []
    before = None
    while True:
        page = await task.client.list_tasks_async(
            state=TaskState.PENDING, name=task.name, limit=PAGE, before=before
        )
        found += page
        if len(page) < PAGE:
            break
        before = page[-1].id
    found.reverse()
    return found


def enqueued(task: TaskDef) -> list[Task]:
    """The pending tasks of ``task`` (a task, workflow or coroutine) in its
    app's store, oldest first: those waiting to run, due now or later
    (delayed, or waiting out a retry's back-off). Each one's ``payload``
    holds its arguments as stored (JSON: a dataclass argument is a dict);
    a workflow's holds its current step's state. Tasks running, waiting for
    a message or finished are not listed. Without attempt logs."""
    return task.client.portal.run(enqueued_async(task))


def assert_enqueued(task: TaskDef, /, **args: Any) -> Task:
    """Pass if at least one pending task of ``task`` (see :func:`enqueued`)
    has these arguments, and return the oldest such task; else raise
    AssertionError listing the pending tasks of ``task`` and counting its
    tasks in other states (a drain, or inline mode, may have run the one
    expected).

    Only the arguments given are compared (``assert_enqueued(send_email,
    to="ada@example.com")`` ignores ``subject``), as the handler would
    receive them: converted to JSON the way ``enqueue`` does (a dataclass
    equals its dict), and with the handler's defaults for arguments the
    task was enqueued without.
    """
    __tracebackhide__ = True
    expected = _plain(args)
    pending = enqueued(task)
    for candidate in pending:
        if _matches(task, candidate, expected):
            return candidate
    wanted = f" with {_arguments_text(expected)}" if expected else ""
    others = _not_pending(task)
    if pending:
        lines = [
            f"no pending task {task.name!r}{wanted}",
            _listing(pending, f"pending tasks of {task.name!r}"),
        ]
        if others:
            lines.append(f"tasks of {task.name!r} not pending: {others}")
        raise AssertionError("\n".join(lines))
    if others:
        raise AssertionError(
            f"no task {task.name!r}{wanted} is pending; tasks of {task.name!r} "
            f"not pending: {others}"
        )
    raise AssertionError(
        f"no task {task.name!r}{wanted} is pending; the store holds no task {task.name!r}"
    )


def assert_not_enqueued(task: TaskDef, /, **args: Any) -> None:
    """Pass if no pending task of ``task`` has these arguments (compared as
    by :func:`assert_enqueued`; none given: if no task of ``task`` is
    pending at all); else raise AssertionError listing those that have."""
    __tracebackhide__ = True
    expected = _plain(args)
    found = [c for c in enqueued(task) if _matches(task, c, expected)]
    if found:
        wanted = f" with {_arguments_text(expected)}" if expected else ""
        raise AssertionError(
            f"expected no pending task {task.name!r}{wanted}; {_listing(found, 'found')}"
        )


def _plain(args: Mapping[str, Any]) -> dict[str, Any]:
    """Arguments as ``enqueue`` would store them, decoded again."""
    decoded: dict[str, Any] = codec.decode(
        codec.encode({key: codec.to_plain(value) for key, value in args.items()})
    )
    return decoded


def _matches(task: TaskDef, candidate: Task, expected: Mapping[str, Any]) -> bool:
    stored = candidate.payload if isinstance(candidate.payload, dict) else {}
    for key, value in expected.items():
        if key in stored:
            if stored[key] != value:
                return False
        elif not _default_is(task, key, value):
            return False
    return True


def _default_is(task: TaskDef, key: str, value: Any) -> bool:
    """Whether the handler's default for ``key`` (as JSON) equals ``value``."""
    parameter = task.signature.parameters.get(key)
    if parameter is None or parameter.default is inspect.Parameter.empty:
        return False
    try:
        return bool(_plain({key: parameter.default})[key] == value)
    except PayloadError:
        return False


def _arguments_text(args: Mapping[str, Any]) -> str:
    return ", ".join(f"{key}={value!r}" for key, value in args.items())


def _listing(tasks: list[Task], title: str) -> str:
    lines = [f"{title} ({len(tasks)}):"]
    lines += [
        f"  #{t.id} {t.payload!r} (run_at {t.run_at.isoformat(timespec='seconds')})"
        for t in tasks[:SHOWN]
    ]
    if len(tasks) > SHOWN:
        lines.append(f"  ... and {len(tasks) - SHOWN} more")
    return "\n".join(lines)


def _not_pending(task: TaskDef) -> str:
    """How many tasks of this name the store holds in each state but pending
    (``"1 in_progress, 2 succeeded"``), or ``""``."""
    counts: dict[str, int] = {}
    for count in task.client.count_tasks():
        if count.name == task.name and count.state is not TaskState.PENDING:
            counts[count.state.value] = counts.get(count.state.value, 0) + count.count
    return ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
