"""Where a handler runs: on the worker's loop, in a thread, or in a process.

Each execution exposes ``wait()`` (the handler's return value, or its
exception) and ``stop()``, the order to stop:

- async handlers run inline in the attempt's task and are cancelled;
- thread handlers cannot be interrupted by Python: they see the order through
  their :class:`~conveyor.context.TaskContext` (``ctx.check()``), and
  ``wait()`` returns only when the thread has really returned;
- process handlers are terminated (SIGTERM, then SIGKILL after a grace).

Thread handlers run in daemon threads, so a handler that ignores every order
to stop cannot keep a stopped worker process alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import importlib
import json
import multiprocessing
import os
import threading
from collections.abc import Callable, Coroutine
from multiprocessing.connection import Connection
from typing import Any, Protocol

from conveyor import payload as codec
from conveyor import typed
from conveyor.errors import PayloadError, Snooze, WorkerShutdown
from conveyor.model import MAX_ERROR_NAMES, error_types
from conveyor.worker.texts import (
    MAX_ERROR_MESSAGE,
    MAX_TRACEBACK,
    cut,
    format_traceback,
    type_name,
)

PROCESS_KILL_GRACE = 0.5
"""Seconds between SIGTERM and SIGKILL for a process handler told to stop."""


class HandlerExit(Exception):
    """A handler raised SystemExit or KeyboardInterrupt; it fails the attempt
    like any error instead of stopping the worker's event loop."""

    def __init__(self, original: BaseException) -> None:
        super().__init__(f"the handler raised {type(original).__name__}")
        self.original = original


class Execution(Protocol):
    async def wait(self) -> Any:
        """The handler's return value; raises what it raised."""

    def stop(self) -> None:
        """Order the handler to stop (see the module docstring per kind)."""

    def abandon(self) -> None:
        """Stop waiting for the handler: ``wait`` raises WorkerShutdown now."""


class InlineExecution:
    """An ``async def`` handler, awaited inside the attempt's own asyncio task.

    No task of its own: ``stop()`` cancels the attempt's task, but only while
    it is inside the handler, so the worker's bookkeeping after the handler
    returns can never be cancelled.
    """

    def __init__(self, coro: Coroutine[Any, Any, Any]) -> None:
        self._coro = coro
        self._task: asyncio.Task[Any] | None = None

    async def wait(self) -> Any:
        self._task = asyncio.current_task()
        try:
            return await self._coro
        except (SystemExit, KeyboardInterrupt) as exc:
            raise HandlerExit(exc) from exc
        except asyncio.CancelledError:
            if self._task is not None and self._task.cancelling():
                self._task.uncancel()
            raise
        finally:
            self._task = None

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def abandon(self) -> None:
        """Cancellation already stops it."""


class ThreadExecution:
    """A plain ``def`` handler in its own daemon thread."""

    def __init__(self, fn: Callable[[], Any], name: str) -> None:
        loop = asyncio.get_running_loop()
        self._future: asyncio.Future[Any] = loop.create_future()

        def deliver(ok: bool, value: Any) -> None:
            if self._future.done():
                return
            if ok:
                self._future.set_result(value)
            else:
                self._future.set_exception(value)

        def run() -> None:
            try:
                value = fn()
            except (SystemExit, KeyboardInterrupt) as exc:
                outcome: tuple[bool, Any] = (False, HandlerExit(exc))
            except BaseException as exc:
                outcome = (False, exc)
            else:
                outcome = (True, value)
            with contextlib.suppress(RuntimeError):  # the loop is closed: worker gone
                loop.call_soon_threadsafe(deliver, *outcome)

        # The handler runs in the context of the attempt (its contextvars: the
        # attempt's trace span, the caller's own), as a coroutine would.
        context = contextvars.copy_context()
        self._thread = threading.Thread(target=context.run, args=(run,), name=name, daemon=True)
        self._thread.start()

    async def wait(self) -> Any:
        return await asyncio.shield(self._future)

    def stop(self) -> None:
        """Nothing to force: the handler sees the order through its context."""

    def abandon(self) -> None:
        if not self._future.done():
            self._future.set_exception(WorkerShutdown("abandoned at shutdown; still running"))


class ProcessCrashedError(Exception):
    """The handler's process ended without reporting a result."""


class RemoteError(Exception):
    """An exception raised by a handler in a child process."""

    def __init__(
        self,
        type_name: str,
        message: str,
        tb: str,
        types: tuple[str, ...] = (),
        pause: float | None = None,
    ) -> None:
        super().__init__(message)
        self.type_name = type_name
        self.remote_traceback = tb
        self.types = types or (type_name,)
        """The qualified names of the error's class and of each it derives from."""
        self.pause = pause
        """A ``Snooze``'s seconds, or a ``Retry``'s delay (None: the policy's)."""


_context: Any = None


def _mp_context() -> Any:
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
    return _context


class ProcessExecution:
    """A handler in a fresh child process (forkserver), for CPU-bound work.

    The child imports the handler by module and qualified name, runs it, and
    sends back JSON over a pipe; nothing is pickled but those strings. The
    child cuts an error to size and checks its result against
    ``max_result_bytes`` before sending, so what this process reads and
    decodes on its event loop stays small whatever the handler did.
    """

    def __init__(
        self, module: str, qualname: str, payload: str, name: str, max_result_bytes: int
    ) -> None:
        loop = asyncio.get_running_loop()
        receiver, sender = _mp_context().Pipe(duplex=False)
        # The lifeline: the child holds the reading end, only this process the
        # writing end. If this worker dies (even by SIGKILL) the child reads
        # EOF and exits, so a handler never outlives the lease it ran under.
        lifeline, self._lifeline = _mp_context().Pipe(duplex=False)
        self._receiver: Connection = receiver
        self._process = _mp_context().Process(
            target=_child_main,
            args=(module, qualname, payload, max_result_bytes, sender, lifeline),
            name=name,
            daemon=True,
        )
        try:
            self._process.start()
        except BaseException:
            for end in (receiver, self._lifeline):
                end.close()
            raise
        finally:
            sender.close()
            lifeline.close()
        self._future: asyncio.Future[bytes | None] = loop.create_future()
        self._loop = loop
        loop.add_reader(receiver.fileno(), self._on_readable)

    def _on_readable(self) -> None:
        self._loop.remove_reader(self._receiver.fileno())
        try:
            data: bytes | None = self._receiver.recv_bytes()
        except (EOFError, OSError):
            data = None
        if not self._future.done():
            self._future.set_result(data)

    async def wait(self) -> Any:
        data = await asyncio.shield(self._future)
        await asyncio.to_thread(self._process.join)
        self._receiver.close()
        self._lifeline.close()
        if data is None:
            raise ProcessCrashedError(
                f"the handler's process exited with code {self._process.exitcode} "
                "without reporting a result"
            )
        message = json.loads(data)
        if "error" in message:
            error = message["error"]
            raise RemoteError(
                error["type"],
                error["message"],
                error["traceback"],
                tuple(error.get("types", ())),
                error.get("pause"),
            )
        return message["result"]

    def stop(self) -> None:
        if self._process.is_alive():
            self._process.terminate()
            timer = threading.Timer(PROCESS_KILL_GRACE, self._kill)
            timer.daemon = True
            timer.start()

    def abandon(self) -> None:
        """Termination already stops it."""

    def _kill(self) -> None:
        if self._process.is_alive():
            self._process.kill()


def _watch_lifeline(lifeline: Connection) -> None:
    with contextlib.suppress(Exception):
        lifeline.recv_bytes()  # nothing is ever sent: this returns on EOF only
    os._exit(70)  # the worker is gone


def _child_main(
    module: str,
    qualname: str,
    payload: str,
    max_result_bytes: int,
    sender: Connection,
    lifeline: Connection,
) -> None:
    """Entry point of the child process: import, run, report as JSON (an
    error cut to size; a result within ``max_result_bytes``)."""
    threading.Thread(target=_watch_lifeline, args=(lifeline,), daemon=True).start()
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
        sender.send_bytes(('{"result":' + result + "}").encode())
    except BaseException as exc:
        error = {
            "type": type_name(type(exc)),
            "message": cut(_safe_str(exc), MAX_ERROR_MESSAGE),
            "traceback": format_traceback(exc, MAX_TRACEBACK),
            "types": error_types(exc)[:MAX_ERROR_NAMES],
            "pause": exc.seconds if isinstance(exc, Snooze) else getattr(exc, "delay", None),
        }
        with contextlib.suppress(Exception):
            sender.send_bytes(json.dumps({"error": error}).encode())
    finally:
        sender.close()
        os._exit(0)


def _safe_str(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:
        return f"<{type(exc).__name__}: str() failed>"
