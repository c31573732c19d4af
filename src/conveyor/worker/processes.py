"""The child processes that run ``process=True`` handlers, kept for reuse.

A worker keeps a pool of handler processes (forkserver children). An attempt
takes an idle one (or starts one), sends it the handler's module, qualified
name and payload, and reads back one JSON reply; the process then returns to
the pool for the next attempt. What a handler imports stays imported, so an
attempt costs a message each way, not a process start and an import.

Guarantees and limits:

- **One attempt at a time per process**, and one process per running process
  attempt: the pool never makes attempts wait for each other.
- **Stopping one attempt kills its process only** (SIGTERM, then SIGKILL
  after ``PROCESS_KILL_GRACE``): a timeout, a cancel, a lost lease or a
  shutdown. A killed or crashed process never returns to the pool; the next
  attempt starts a fresh one.
- **A handler process never outlives its worker**: each watches a pipe that
  only the worker holds open, and exits when it reads EOF (even after the
  worker's SIGKILL), whether it is idle or running a handler.
- **Reuse is not isolation**: module globals, caches and leaked memory of
  one attempt are there for the next in the same process. A worker keeps at
  most ``keep`` idle processes (``WorkerConfig.process_pool``; default the
  CPU count); ``process_pool=0`` starts a fresh process per attempt.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import multiprocessing
import os
import threading
from multiprocessing.connection import Connection
from typing import Any

from conveyor import payload as codec
from conveyor import typed
from conveyor.errors import PayloadError, Snooze
from conveyor.model import MAX_ERROR_NAMES, error_types
from conveyor.worker.texts import MAX_ERROR_MESSAGE, MAX_TRACEBACK, cut, format_traceback, type_name

PROCESS_KILL_GRACE = 0.5
"""Seconds between SIGTERM and SIGKILL for a process handler told to stop."""
CLOSE_JOIN = 2.0
"""Seconds a closing pool waits for each idle process to exit before killing it."""

_context: Any = None


def _mp_context() -> Any:
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
    return _context


class HandlerProcess:
    """One child process that runs process handlers, one job at a time.

    ``conn`` carries jobs to the child and its replies back (bytes of JSON);
    the lifeline is a second pipe the child only watches for EOF.
    """

    def __init__(self) -> None:
        ctx = _mp_context()
        self.conn, child_conn = ctx.Pipe(duplex=True)
        lifeline, self._lifeline = ctx.Pipe(duplex=False)
        self.process = ctx.Process(
            target=_serve, args=(child_conn, lifeline), name="conveyor-handler", daemon=True
        )
        try:
            self.process.start()
        except BaseException:
            self.conn.close()
            self._lifeline.close()
            raise
        finally:
            child_conn.close()
            lifeline.close()

    @property
    def pid(self) -> int:
        pid: int | None = self.process.pid
        assert pid is not None  # started in __init__
        return pid

    def alive(self) -> bool:
        return bool(self.process.is_alive())

    def submit(self, module: str, qualname: str, payload: str, max_result_bytes: int) -> None:
        """Send one job; its reply comes back on ``conn``."""
        job = {
            "module": module,
            "qualname": qualname,
            "payload": payload,
            "max_result_bytes": max_result_bytes,
        }
        self.conn.send_bytes(json.dumps(job).encode())

    def terminate(self) -> None:
        """SIGTERM now, SIGKILL after ``PROCESS_KILL_GRACE`` if still alive."""
        if self.process.is_alive():
            self.process.terminate()
            timer = threading.Timer(PROCESS_KILL_GRACE, self.kill)
            timer.daemon = True
            timer.start()

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()

    def close(self) -> None:
        """Close this side's pipes: an idle child reads EOF and exits."""
        self.conn.close()
        self._lifeline.close()

    def reap(self, timeout: float | None = None) -> None:
        """Close the pipes and wait for the process to end (blocking)."""
        self.close()
        self.process.join(timeout)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()


class ProcessPool:
    """A worker's idle handler processes: at most ``keep`` of them."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self._idle: list[HandlerProcess] = []
        self.started = 0
        """Handler processes started so far."""

    @property
    def idle(self) -> int:
        return len(self._idle)

    def take(self) -> HandlerProcess:
        """An idle live process, or a new one."""
        while self._idle:
            process = self._idle.pop()
            if process.alive():
                return process
            process.close()
        self.started += 1
        return HandlerProcess()

    async def give_back(self, process: HandlerProcess, reusable: bool) -> None:
        """Keep ``process`` for the next attempt if it is ``reusable`` and the
        pool has room; else end it."""
        if reusable and len(self._idle) < self.keep and process.alive():
            self._idle.append(process)
            return
        await asyncio.to_thread(process.reap, CLOSE_JOIN)

    async def close(self) -> None:
        """End every idle process (a running one is its attempt's to end)."""
        idle, self._idle = self._idle, []
        for process in idle:
            process.close()
        for process in idle:
            await asyncio.to_thread(process.reap, CLOSE_JOIN)


def _watch_lifeline(lifeline: Connection) -> None:
    with contextlib.suppress(Exception):
        lifeline.recv_bytes()  # nothing is ever sent: this returns on EOF only
    os._exit(70)  # the worker is gone


def _serve(conn: Connection, lifeline: Connection) -> None:
    """Entry point of a handler process: run jobs until the worker closes the pipe."""
    threading.Thread(target=_watch_lifeline, args=(lifeline,), daemon=True).start()
    try:
        while True:
            try:
                job = json.loads(conn.recv_bytes())
            except (EOFError, OSError):
                break
            reply = _run(
                job["module"], job["qualname"], job["payload"], int(job["max_result_bytes"])
            )
            conn.send_bytes(reply)
    finally:
        os._exit(0)


def _run(module: str, qualname: str, payload: str, max_result_bytes: int) -> bytes:
    """Import and run one handler; its reply as JSON (an error cut to size,
    a result within ``max_result_bytes``)."""
    try:
        target: Any = importlib.import_module(module)
        for part in qualname.split("."):
            target = getattr(target, part)
        if not hasattr(target, "build_kwargs"):  # the bare handler, registered elsewhere
            target = typed.BareHandler(target)
        fn = getattr(target, "fn", target)
        build = getattr(target, "build_kwargs", None)
        args = json.loads(payload)
        kwargs = build(args, None) if build else args
        value = fn(**kwargs)
        if asyncio.iscoroutine(value):
            value = asyncio.run(value)
        encode = getattr(target, "encode_result", codec.encode)
        try:
            result = encode(value, max_result_bytes)
        except PayloadError as exc:
            raise PayloadError(f"the result is not stored: {exc}") from None
        return ('{"result":' + result + "}").encode()
    except BaseException as exc:
        error = {
            "type": type_name(type(exc)),
            "message": cut(_safe_str(exc), MAX_ERROR_MESSAGE),
            "traceback": format_traceback(exc, MAX_TRACEBACK),
            "types": error_types(exc)[:MAX_ERROR_NAMES],
            "pause": exc.seconds if isinstance(exc, Snooze) else getattr(exc, "delay", None),
        }
        try:
            return json.dumps({"error": error}).encode()
        except Exception:  # a pause that is not a number: report the error without it
            error["pause"] = None
            return json.dumps({"error": error}, default=str).encode()


def _safe_str(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:
        return f"<{type(exc).__name__}: str() failed>"
