"""What a worker is doing, for an operator: ``kill -USR1 PID`` logs it.

The dump lists every asyncio task of the worker's event loop with the
frames it is suspended in, and every thread with its current frames, in one
WARNING record of the ``conveyor.worker`` logger. It reads state only; the
worker goes on as before.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import traceback
from types import FrameType


def state_dump() -> str:
    """The asyncio tasks of the running loop and the threads, with their frames."""
    lines = []
    tasks = sorted(asyncio.all_tasks(), key=lambda t: t.get_name())
    lines.append(f"{len(tasks)} asyncio tasks:")
    for task in tasks:
        lines.append(f"-- task {task.get_name()}")
        lines.extend(_awaiting(task.get_coro()))
    names = {t.ident: t.name for t in threading.enumerate()}
    current = sys._current_frames()
    lines.append(f"{len(current)} threads:")
    for ident, frame in current.items():
        lines.append(f"-- thread {names.get(ident, ident)}")
        lines.extend(line.rstrip() for line in traceback.format_stack(frame))
    return "\n".join(lines)


def _awaiting(coro: object) -> list[str]:
    """The frames of a suspended coroutine and of those it awaits, down to
    the future it waits for."""
    lines = []
    while coro is not None:
        frame: FrameType | None = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is None:
            break
        code = frame.f_code
        lines.append(f'  File "{code.co_filename}", line {frame.f_lineno}, in {code.co_name}')
        awaited = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
        if awaited is not None and not (
            hasattr(awaited, "cr_frame") or hasattr(awaited, "gi_frame")
        ):
            lines.append(f"    waiting for {awaited!r}")
        coro = awaited
    return lines
