"""A worker process's session connection: LISTEN, the wake-up turns and the
heartbeats on one server session, on a thread of its own.

What binds to a server session, and what must not wait on the worker's
event loop, shares one connection per backend: the LISTEN on the wake-up,
cancel and hand-off channels, the wake-up turns' advisory locks, and the
heartbeats (:class:`SessionHeartbeats`). It runs on a thread and event loop
of its own ("conveyor-session"), so that nothing a handler does on the
worker's loop (a busy ``async def``, a full pool) can delay a renewal; the
worker's loop reaches it across threads. It opens at its first user and
closes with its last; it connects to the listen address (past a pooler in
transaction mode, see :mod:`.urls`), with conveyor's session settings.

One reader holds the connection while it waits for notices; a statement
(a heartbeat, a turn's, a worker's claim) stops it, runs, and lets it read
again (notices that arrive meanwhile are kept by psycopg and read then).

- **Listeners** (:meth:`Session.wakeups`) get what they asked for, each in
  a buffer of its own on its own loop (a queue already waiting there is not
  added twice): queue names, cancel hints, hand-offs. After each (re)connect
  every listener gets every queue, a cancel hint without an id and (with a
  hand-off channel) ``HandOffsHeard``: anything sent while nobody listened
  may be due, or to stop, or handed off, now. The connection reconnects on
  its own, with back-off.
- **Turns** (:class:`SessionTurnLock`) are taken with
  ``pg_try_advisory_lock``, never by waiting in ``pg_advisory_lock``
  (which would hold the connection): a worker that did not get its turn
  waits for a notice on the turn channel, sent by each ``turn_give``, or
  ``TURN_RETRY`` seconds (the session of a holder that died gives the lock
  back with no notice), and tries again. Waiters race for a given turn;
  none is first in line.
- **Statements** wait up to ``CONNECTED_WAIT`` seconds for the connection
  (BackendUnavailableError after); one that fails ends the connection,
  which reconnects (and gives back any turn it held).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import psycopg
from psycopg import AsyncConnection, sql

from conveyor.backends.params import (
    CancelHint,
    HandOffsHeard,
    HeartbeatParams,
    HeartbeatResult,
    Wakeup,
)
from conveyor.backends.postgres import handoffs
from conveyor.backends.postgres.loaders import ADAPTERS
from conveyor.backends.reconnect import Outage
from conveyor.errors import BackendUnavailableError

log = logging.getLogger("conveyor.postgres")

T = TypeVar("T")

TURN_RETRY = 1.0
"""Seconds a worker that did not get its turn waits before trying again,
unless a turn is given back before (a notice on the turn channel)."""
CONNECTED_WAIT = 5.0
"""Seconds a statement waits for the session to connect before it fails."""
STOP_WAIT = 10.0
"""Seconds to wait for the session's thread to end when its last user goes."""


@dataclass(eq=False)
class _Listener:
    """One consumer of wake-ups; lives on its consumer's loop, fed from the
    session's through :meth:`deliver`."""

    queues: Collection[str]
    handed: str | None
    worker: str
    loop: asyncio.AbstractEventLoop
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    buffer: deque[Wakeup] = field(default_factory=deque)
    waiting: set[str] = field(default_factory=set)
    """The queue names in ``buffer``."""

    def deliver(self, wakeup: Wakeup) -> None:
        """From the session's thread."""
        with contextlib.suppress(RuntimeError):  # its loop closed
            self.loop.call_soon_threadsafe(self._put, wakeup)

    def _put(self, wakeup: Wakeup) -> None:
        if isinstance(wakeup, str):
            if wakeup in self.waiting:
                return
            self.waiting.add(wakeup)
        self.buffer.append(wakeup)
        self.ready.set()

    async def get(self) -> Wakeup:
        while not self.buffer:
            self.ready.clear()
            await self.ready.wait()
        wakeup = self.buffer.popleft()
        if isinstance(wakeup, str):
            self.waiting.discard(wakeup)
        return wakeup

    def connected(self) -> None:
        if self.handed is not None:
            self.deliver(HandOffsHeard())
        for queue in self.queues:
            self.deliver(queue)
        self.deliver(CancelHint())

    def lost(self) -> None:
        if self.handed is not None:
            self.deliver(HandOffsHeard(connected=False, lost=True))


class Session:
    """The session connection of one backend (see the module's docstring).
    Its methods may be called from any thread's event loop."""

    def __init__(self, url: str, configure: bytes, channel: str, cancels: str, turns: str) -> None:
        self._url = url
        self._configure = configure
        self._channel = channel
        self._cancels = cancels
        self._turns = turns
        self._guard = threading.Lock()
        self._users = 0
        self._thread: threading.Thread | None = None
        self._ending: threading.Thread | None = None
        """A thread told to end, waited for before another starts."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        # The rest is the session thread's own.
        self._listeners: set[_Listener] = set()
        self._channels: set[str] = {turns}
        self._listening: set[str] = set()
        self._conn: AsyncConnection[Any] | None = None
        self._connected: asyncio.Event | None = None
        self._free: asyncio.Event | None = None
        """Set while no statement wants the connection: the reader may read."""
        self._using = 0
        self._reading: asyncio.Task[None] | None = None
        self.generation = 0
        """Connections made so far: a turn taken on an earlier one is gone."""
        self._given: dict[int, asyncio.Event] = {}

    # -- users -----------------------------------------------------------------

    def acquire(self) -> None:
        """One more user: the thread starts (and connects) with the first."""
        with self._guard:
            self._users += 1
            if self._thread is None:
                if self._ending is not None:
                    self._ending.join(STOP_WAIT)
                    self._ending = None
                ready = threading.Event()
                self._thread = threading.Thread(
                    target=self._main, args=(ready,), name="conveyor-session", daemon=True
                )
                self._thread.start()
                ready.wait()

    async def release(self) -> None:
        """One user fewer: the connection and the thread end with the last."""
        with self._guard:
            self._users = max(0, self._users - 1)
            if self._users > 0 or self._thread is None:
                return
            thread, self._thread = self._thread, None
            self._ending = thread
            loop, stop = self._loop, self._stop
        if loop is not None and stop is not None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stop.set)
        await asyncio.to_thread(thread.join, STOP_WAIT)
        with self._guard:
            if self._ending is thread:
                self._ending = None

    async def close(self) -> None:
        """End the connection and the thread, whoever still uses them."""
        with self._guard:
            self._users = 1
        await self.release()

    async def wakeups(
        self, queues: Sequence[str], handoffs_for: tuple[str, str] | None = None
    ) -> AsyncIterator[Wakeup]:
        """Queue names from the wake-up channel (only ``queues``), cancel
        hints, and the hand-offs to ``handoffs_for`` (a worker's id and
        nonce); ends only when the consumer stops iterating."""
        handed, worker = None, ""
        if handoffs_for is not None:
            worker, nonce = handoffs_for
            handed = handoffs.channel(self._channel, worker, nonce)
        listener = _Listener(frozenset(queues), handed, worker, asyncio.get_running_loop())
        wanted = {self._channel, self._cancels} | ({handed} if handed else set())
        self.acquire()
        try:
            await self._call(lambda: self._add(listener, wanted))
            while True:
                yield await listener.get()
        finally:
            with contextlib.suppress(Exception):
                await self._call(lambda: self._remove(listener))
            await self.release()

    def turn_lock(self, take_sql: bytes, give_sql: bytes, key: int) -> SessionTurnLock:
        return SessionTurnLock(self, take_sql, give_sql, key)

    async def fetchone(self, statement: bytes, params: dict[str, Any]) -> tuple[Any, ...] | None:
        """Run ``statement`` on the session connection (see the module's docstring)."""
        rows = await self.fetchall(statement, params)
        return rows[0] if rows else None

    async def fetchall(self, statement: bytes, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        """Run ``statement`` on the session connection (see the module's docstring)."""
        return await self._call(lambda: self._fetchall(statement, params))

    async def run(self, work: Callable[[AsyncConnection[Any]], Awaitable[T]]) -> T:
        """``work(connection)`` on the session's loop, with the connection
        to itself (see the module's docstring)."""
        return await self._call(lambda: self._with(work))

    async def given(self, key: int, timeout: float) -> None:
        """Wait for a notice that the turn ``key`` was given back, or ``timeout``."""
        await self._call(lambda: self._wait_given(key, timeout))

    # -- across threads ----------------------------------------------------------

    async def _call(self, work: Callable[[], Awaitable[T]]) -> T:
        """Run ``work()`` on the session's loop and wait for it here. The
        session ending under it is BackendUnavailableError, not a
        cancellation of the caller."""
        loop = self._loop
        if loop is None or loop.is_closed() or self._thread is None:
            raise BackendUnavailableError("the session connection is closed")

        async def run() -> T:
            return await work()

        try:
            future = asyncio.run_coroutine_threadsafe(run(), loop)
        except RuntimeError:  # its loop closed
            raise BackendUnavailableError("the session connection is closed") from None
        try:
            return await asyncio.wrap_future(future)
        except (asyncio.CancelledError, concurrent.futures.CancelledError):
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                future.cancel()
                raise
            raise BackendUnavailableError("the session connection closed") from None

    def _main(self, ready: threading.Event) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            self._connected = asyncio.Event()
            self._free = asyncio.Event()
            self._free.set()
            self._using = 0
            self._reading = None
            self._listeners = set()
            self._channels = {self._turns}
            self._given = {}
            ready.set()
            runner = asyncio.get_running_loop().create_task(self._run())
            await self._stop.wait()
            runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await runner

        try:
            asyncio.run(main())
        finally:
            ready.set()

    # -- on the session's loop ---------------------------------------------------

    async def _add(self, listener: _Listener, wanted: set[str]) -> None:
        self._listeners.add(listener)
        self._channels |= wanted
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error, BackendUnavailableError):
                async with self._use() as conn:
                    await self._listen(conn)
            listener.connected()

    async def _remove(self, listener: _Listener) -> None:
        self._listeners.discard(listener)

    @contextlib.asynccontextmanager
    async def _use(self) -> AsyncIterator[AsyncConnection[Any]]:
        """The connection, once connected, with the reader stopped until
        the last statement that wants it is done. A psycopg error ends the
        connection, which the reader makes again."""
        assert self._connected is not None
        assert self._free is not None
        try:
            async with asyncio.timeout(CONNECTED_WAIT):
                await self._connected.wait()
        except TimeoutError:
            raise BackendUnavailableError("the session connection is not connected") from None
        conn = self._conn
        assert conn is not None
        self._using += 1
        self._free.clear()
        if self._reading is not None:
            self._reading.cancel()
        try:
            yield conn
        except psycopg.Error:
            if self._conn is conn:
                self._connected.clear()
                self._conn = None
            raise
        finally:
            self._using -= 1
            if self._using == 0:
                self._free.set()

    async def _fetchall(self, statement: bytes, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        async with self._use() as conn:
            cursor = await conn.execute(statement, params)
            return await cursor.fetchall() if cursor.description else []

    async def _with(self, work: Callable[[AsyncConnection[Any]], Awaitable[T]]) -> T:
        async with self._use() as conn:
            return await work(conn)

    async def _wait_given(self, key: int, timeout: float) -> None:
        event = self._given.setdefault(key, asyncio.Event())
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await event.wait()
        event.clear()

    async def _listen(self, conn: AsyncConnection[Any]) -> None:
        new = sorted(self._channels - self._listening)
        if new:
            await conn.execute(
                sql.SQL("; ").join(sql.SQL("listen {}").format(sql.Identifier(c)) for c in new),
                prepare=False,
            )
            self._listening.update(new)

    async def _run(self) -> None:
        assert self._connected is not None
        outage = Outage(log)
        while True:
            conn: AsyncConnection[Any] | None = None
            try:
                conn = await AsyncConnection.connect(
                    self._url, autocommit=True, context=ADAPTERS, prepare_threshold=0
                )
                await conn.execute(self._configure, prepare=False)
                self._listening = set()
                await self._listen(conn)
                self._conn = conn
                self.generation += 1
                self._connected.set()
                outage.connected()
                for listener in list(self._listeners):
                    listener.connected()
                for event in self._given.values():
                    event.set()  # a turn held on a lost session is free now
                while self._conn is conn:
                    await self._read(conn)
                # A statement failed on it: end it, and connect again.
                for listener in list(self._listeners):
                    listener.lost()
                await conn.close()
            except psycopg.Error as exc:
                self._connected.clear()
                self._conn = None
                for listener in list(self._listeners):
                    listener.lost()
                if conn is not None:
                    with contextlib.suppress(psycopg.Error):
                        await conn.close()
                await outage.lost(exc)
            except BaseException:
                self._connected.clear()
                self._conn = None
                if conn is not None:
                    with contextlib.suppress(BaseException):
                        await asyncio.shield(conn.close())
                raise

    async def _read(self, conn: AsyncConnection[Any]) -> None:
        """Read notices until a statement wants the connection (or it fails)."""
        assert self._free is not None
        await self._free.wait()
        if self._conn is not conn:
            return
        await self._listen(conn)  # channels of listeners added meanwhile
        # Checked again with no await before the reader starts: a statement
        # that came meanwhile (even between the wait and here) saw no reader
        # to stop, and must not find one holding the connection.
        if not self._free.is_set() or self._conn is not conn:
            return
        self._reading = asyncio.get_running_loop().create_task(self._notices(conn))
        try:
            await self._reading
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise
        finally:
            self._reading = None

    async def _notices(self, conn: AsyncConnection[Any]) -> None:
        async for note in conn.notifies():
            self._dispatch(note)

    def _dispatch(self, note: psycopg.Notify) -> None:
        if note.channel == self._turns:
            if note.payload.lstrip("-").isdigit():
                event = self._given.get(int(note.payload))
                if event is not None:
                    event.set()
            return
        for listener in self._listeners:
            if note.channel == listener.handed:
                heard = _handed_off(note.payload, listener.worker)
                if heard is not None:
                    listener.deliver(heard)
            elif note.channel == self._cancels:
                listener.deliver(CancelHint(int(note.payload) if note.payload.isdigit() else None))
            elif note.channel == self._channel and note.payload in listener.queues:
                listener.deliver(note.payload)


class SessionTurnLock:
    """A wake-up turn on the session connection (see the module's docstring)."""

    def __init__(self, session: Session, take_sql: bytes, give_sql: bytes, key: int) -> None:
        self._session = session
        self._take = take_sql
        self._give = give_sql
        self._key = key
        self._params = {"kind": key}
        self._held_in: int | None = None
        """The session's generation the turn was taken in (None: not held)."""
        self._open = False

    async def take(self) -> None:
        if not self._open:
            self._open = True
            self._session.acquire()
        while True:
            found = await self._session.fetchone(self._take, self._params)
            if found is not None and found[0]:
                self._held_in = self._session.generation
                return
            await self._session.given(self._key, TURN_RETRY)

    async def give(self) -> None:
        held_in, self._held_in = self._held_in, None
        if held_in is None or held_in != self._session.generation:
            return  # not held, or given back with its session
        await self._session.fetchone(self._give, self._params)

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.give()
        if self._open:
            self._open = False
            await self._session.release()


class SessionHeartbeats:
    """The heartbeats of a worker on the session connection: what the
    worker's heartbeat thread calls instead of a backend of its own.
    ``open`` and ``close`` take and leave the session."""

    def __init__(
        self,
        session: Session,
        statement: bytes,
        args: Callable[[HeartbeatParams], dict[str, Any]],
        result: Callable[[HeartbeatParams, Sequence[Sequence[Any]]], HeartbeatResult],
    ) -> None:
        self._session = session
        self._statement = statement
        self._args = args
        self._result = result
        self._open = False

    async def open(self) -> None:
        if not self._open:
            self._open = True
            self._session.acquire()

    async def close(self) -> None:
        if self._open:
            self._open = False
            await self._session.release()

    async def heartbeat(self, params: HeartbeatParams) -> HeartbeatResult:
        rows = await self._session.fetchall(self._statement, self._args(params))
        return self._result(params, rows)


def _handed_off(payload: str, worker_id: str) -> Wakeup | None:
    """A notice on the hand-off channel: an offer's (digits) says the
    channel is heard; one that does not read is logged and passed by."""
    if payload.isdigit():
        return HandOffsHeard(connected=False, ping=int(payload))
    try:
        return handoffs.notice(payload, worker_id)
    except Exception as exc:
        log.error("a hand-off notice does not read (%s): %.200r", exc, payload)
        return None
