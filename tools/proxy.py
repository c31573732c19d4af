"""A TCP proxy in front of a database, to cut or black-hole connections (tests, chaos runs).

``Proxy`` listens on 127.0.0.1 (a free port) and forwards every connection to
the database a URL names. It runs its own event loop in a background thread,
so the code under test (its own loops, its own threads) never has to yield to
it. Every control method is synchronous and has taken effect when it returns:

- ``cut()`` resets (RST) every open connection at once, and keeps listening:
  the next connection goes through;
- ``blackhole()`` keeps every connection open but forwards nothing in either
  direction, and holds new connections unanswered (TCP-connected, never
  answered), like a network that swallows packets; ``restore()`` delivers
  what was held back and forwards again;
- ``strand()`` silences every open connection for good (no RST, nothing ever
  forwarded again, as after a failover or a middlebox that forgot them)
  while new connections go through.

``url`` is the upstream URL with the proxy's address. ``delay`` (seconds)
holds every chunk that long, each way, as a longer network would (the
benchmarks' remote workers); the event loop's timers round it up to about a
millisecond.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

T = TypeVar("T")

DEFAULT_UPSTREAM = "postgresql://127.0.0.1:5432/test"
CHUNK = 64 * 1024
CONTROL_TIMEOUT = 10.0
_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 seconds: close() sends a RST


class _Pair:
    """One client connection and, once connected, its upstream connection."""

    __slots__ = ("client", "server", "stranded", "task")

    def __init__(self, client: asyncio.StreamWriter, task: asyncio.Task[None]) -> None:
        self.client = client
        self.server: asyncio.StreamWriter | None = None
        self.task = task
        self.stranded = False

    def reset(self) -> None:
        for writer in (self.client, self.server):
            if writer is None or writer.transport.is_closing():
                continue
            sock = writer.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
            writer.transport.abort()
        self.task.cancel()


class Proxy:
    """``start()``, then point clients at ``url``; ``stop()`` when done."""

    def __init__(
        self, upstream_url: str = DEFAULT_UPSTREAM, host: str = "127.0.0.1", delay: float = 0.0
    ) -> None:
        parts = urlsplit(upstream_url)
        self.delay = delay
        self._parts = parts
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 5432)
        self.host = host
        self.port = 0
        self.accepted = 0
        """Client connections accepted so far."""
        self.cuts = 0
        """Calls to ``cut()`` so far."""
        self._pairs: set[_Pair] = set()
        self._every: list[_Pair] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._open: asyncio.Event | None = None  # set: forwarding; clear: black-holed
        self._refusing = False
        self._done: asyncio.Event | None = None

    # -- public API ---------------------------------------------------------------

    @property
    def url(self) -> str:
        if not self.port:
            raise RuntimeError("the proxy is not started")
        userinfo = self._parts.netloc.rpartition("@")[0]
        netloc = f"{userinfo}@{self.host}:{self.port}" if userinfo else f"{self.host}:{self.port}"
        return urlunsplit(self._parts._replace(netloc=netloc))

    @property
    def connections(self) -> int:
        """Client connections open now."""
        return len(self._pairs)

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("the proxy is already started")
        ready = threading.Event()
        failure: list[BaseException] = []
        self._thread = threading.Thread(
            target=self._main, args=(ready, failure), name="test-proxy", daemon=True
        )
        self._thread.start()
        if not ready.wait(CONTROL_TIMEOUT):
            raise RuntimeError("the proxy did not start")
        if failure:
            self._thread.join(CONTROL_TIMEOUT)
            self._thread = None
            raise failure[0]

    def stop(self) -> None:
        """Reset every connection, stop listening and end the thread (idempotent)."""
        thread, loop, done = self._thread, self._loop, self._done
        if thread is None or loop is None or done is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop is already gone
            loop.call_soon_threadsafe(done.set)
        thread.join(CONTROL_TIMEOUT)
        if thread.is_alive():
            raise RuntimeError("the proxy thread did not stop")
        self._thread = self._loop = None

    def cut(self) -> int:
        """Reset every open connection (RST both ways); return how many were cut."""
        self.cuts += 1
        return self._call(self._cut())

    def blackhole(self) -> None:
        """Forward nothing, in either direction, on old or new connections."""
        self._call(self._set_open(False))

    def restore(self) -> None:
        """Forward again, including everything held back; accept again."""
        self._refusing = False
        self._call(self._set_open(True))

    def refuse(self) -> int:
        """Act like a server that is down: reset every open connection and every
        new one at once, until ``restore()``; return how many were cut."""
        self._refusing = True
        return self.cut()

    def strand(self) -> int:
        """Forward nothing more, ever, on the connections open now (they stay
        open, until ``cut()``); new ones go through. Return how many."""
        return self._call(self._strand())

    def __enter__(self) -> Proxy:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the proxy's own thread ------------------------------------------------------

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        loop = self._loop
        if loop is None:
            coro.close()
            raise RuntimeError("the proxy is not running")
        return asyncio.run_coroutine_threadsafe(coro, loop).result(CONTROL_TIMEOUT)

    def _main(self, ready: threading.Event, failure: list[BaseException]) -> None:
        try:
            asyncio.run(self._serve(ready))
        except BaseException as exc:
            failure.append(exc)
        finally:
            ready.set()

    async def _serve(self, ready: threading.Event) -> None:
        self._loop = asyncio.get_running_loop()
        self._open = asyncio.Event()
        self._open.set()
        self._done = asyncio.Event()
        self._server = await asyncio.start_server(self._accept, self.host, 0)
        self.port = self._server.sockets[0].getsockname()[1]
        ready.set()
        try:
            await self._done.wait()
        finally:
            self._server.close()
            await self._cut()
            await self._server.wait_closed()
            # Every transport ever opened is closed before the loop ends: an
            # abort closes its socket in a callback, which must get to run.
            for pair in self._every:
                pair.reset()
            for _ in range(3):
                await asyncio.sleep(0)

    async def _set_open(self, value: bool) -> None:
        assert self._open is not None
        if value:
            self._open.set()
        else:
            self._open.clear()

    async def _strand(self) -> int:
        for pair in self._pairs:
            pair.stranded = True
        return len(self._pairs)

    async def _cut(self) -> int:
        pairs = list(self._pairs)
        for pair in pairs:
            pair.reset()
        if pairs:
            await asyncio.wait([p.task for p in pairs])
        return len(pairs)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        assert self._open is not None
        self.accepted += 1
        if self._refusing:
            writer.transport.abort()  # RST: nothing listens here, for now
            return
        pair = _Pair(writer, task)
        self._pairs.add(pair)
        self._every.append(pair)
        pumps: list[asyncio.Task[None]] = []
        try:
            await self._open.wait()  # black-holed: connected, never answered
            if pair.stranded:
                await _forever()
            up_reader, pair.server = await asyncio.open_connection(*self.upstream)
            pumps = [
                asyncio.create_task(self._pump(pair, reader, pair.server)),
                asyncio.create_task(self._pump(pair, up_reader, writer)),
            ]
            # One side closed (or failed): close the other, as PostgreSQL would.
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            self._pairs.discard(pair)
            for pump in pumps:
                pump.cancel()
            if pumps:
                await asyncio.wait(pumps)
            for side in (writer, pair.server):
                if side is not None:
                    side.close()
                    with contextlib.suppress(OSError):
                        await side.wait_closed()

    async def _pump(
        self, pair: _Pair, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        assert self._open is not None
        if self.delay > 0:
            await self._pump_late(reader, writer)
            return
        with contextlib.suppress(OSError):
            while True:
                await self._open.wait()
                data = await reader.read(CHUNK)
                await self._open.wait()  # held back, end of stream included
                if pair.stranded:
                    await _forever()  # swallowed
                if not data:
                    return
                writer.write(data)
                await writer.drain()

    async def _pump_late(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Forward each chunk ``delay`` seconds after it arrived, in order."""
        loop = asyncio.get_running_loop()
        late: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, data = await late.get()
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                if not data:
                    return
                writer.write(data)
                await writer.drain()

        delivering = asyncio.create_task(deliver())
        try:
            with contextlib.suppress(OSError):
                while True:
                    data = await reader.read(CHUNK)
                    late.put_nowait((loop.time() + self.delay, data))
                    if not data:
                        break
                await delivering
        finally:
            delivering.cancel()


async def _forever() -> None:
    """Until cancelled (by ``cut()`` or ``stop()``)."""
    await asyncio.get_running_loop().create_future()
