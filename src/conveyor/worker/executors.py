"""Where a handler runs: on the worker's loop, in a thread, or in a process.

Each execution exposes ``wait()`` (the handler's return value, or its
exception) and ``stop()``, the order to stop:

- async handlers run inline in the attempt's task and are cancelled;
- thread handlers cannot be interrupted by Python: they see the order through
  their :class:`~conveyor.context.TaskContext` (``ctx.check()``), and
  ``wait()`` returns only when the thread has really returned;
- process handlers run in a process of the worker's pool
  (:mod:`conveyor.worker.processes`), terminated (SIGTERM, then SIGKILL after
  a grace) when told to stop.

Thread handlers run in daemon threads, so a handler that ignores every order
to stop cannot keep a stopped worker process alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import threading
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from conveyor.errors import WorkerShutdown
from conveyor.worker.processes import ProcessPool


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

    def __init__(self, coro: Coroutine[Any, Any, Any], loop: asyncio.AbstractEventLoop) -> None:
        self._coro = coro
        self._loop = loop
        self._task: asyncio.Task[Any] | None = None

    async def wait(self) -> Any:
        self._task = asyncio.current_task(self._loop)
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


class ProcessExecution:
    """A handler in a handler process of the worker's pool, for CPU-bound work.

    The process imports the handler by module and qualified name, runs it,
    and sends back JSON; nothing is pickled but those strings. It cuts an
    error to size and checks its result against ``max_result_bytes`` before
    sending, so what this process reads and decodes on its event loop stays
    small whatever the handler did. ``stop()`` kills this attempt's process
    (never one that already went back to the pool).
    """

    def __init__(
        self,
        pool: ProcessPool,
        module: str,
        qualname: str,
        payload: str,
        max_result_bytes: int,
    ) -> None:
        loop = asyncio.get_running_loop()
        self._pool = pool
        self.process = pool.take()
        try:
            self.process.submit(module, qualname, payload, max_result_bytes)
        except BaseException:
            self.process.kill()
            self.process.close()
            raise
        self._stopped = False
        self._future: asyncio.Future[bytes | None] = loop.create_future()
        self._loop = loop
        loop.add_reader(self.process.conn.fileno(), self._on_readable)

    def _on_readable(self) -> None:
        self._loop.remove_reader(self.process.conn.fileno())
        try:
            data: bytes | None = self.process.conn.recv_bytes()
        except (EOFError, OSError):
            data = None
        if not self._future.done():
            self._future.set_result(data)

    async def wait(self) -> Any:
        data = await asyncio.shield(self._future)
        if data is None:
            await asyncio.to_thread(self.process.reap)
            raise ProcessCrashedError(
                f"the handler's process exited with code {self.process.process.exitcode} "
                "without reporting a result"
            )
        await self._pool.give_back(self.process, reusable=not self._stopped)
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
        if self._future.done():
            return  # its process has answered: it may already serve another attempt
        self._stopped = True
        self.process.terminate()

    def abandon(self) -> None:
        """Termination already stops it."""
