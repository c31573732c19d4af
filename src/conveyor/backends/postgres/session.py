"""A worker process's session connection: LISTEN and the wake-up turns on one.

What binds to a server session rather than to a statement shares one
connection per backend: the LISTEN on the wake-up, cancel and hand-off
channels, and the wake-up turns' advisory locks. It opens at the first
listener or turn lock and closes with the last; it connects to the listen
address (past a pooler in transaction mode, see :mod:`.urls`).

One reader holds the connection while it waits for notices, in slices of
``READ_SLICE`` seconds; a statement of a turn lock runs between two
slices (psycopg's connection lock grants waiters in turn), and notices that
arrive during it are kept by psycopg and read in the next slice.

- **Listeners** (:meth:`Session.wakeups`) get what they asked for, each in
  a buffer of its own (a queue already waiting there is not added twice):
  queue names, cancel hints, hand-offs. After each (re)connect every
  listener gets every queue, a cancel hint without an id and (with a
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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import AsyncConnection, sql

from conveyor.backends.params import CancelHint, HandOffsHeard, Wakeup
from conveyor.backends.postgres import handoffs
from conveyor.backends.reconnect import Outage
from conveyor.errors import BackendUnavailableError

log = logging.getLogger("conveyor.postgres")

READ_SLICE = 0.05
"""Seconds the reader waits for notices before it lets a statement run."""
TURN_RETRY = 1.0
"""Seconds a worker that did not get its turn waits before trying again,
unless a turn is given back before (a notice on the turn channel)."""
CONNECTED_WAIT = 5.0
"""Seconds a turn lock waits for the session to connect before it fails
(its worker then answers every wake-up until it gets the turn)."""


@dataclass(eq=False)
class _Listener:
    queues: Collection[str]
    handed: str | None
    worker: str
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    buffer: deque[Wakeup] = field(default_factory=deque)
    waiting: set[str] = field(default_factory=set)
    """The queue names in ``buffer``."""

    def put(self, wakeup: Wakeup) -> None:
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
            self.put(HandOffsHeard())
        for queue in self.queues:
            self.put(queue)
        self.put(CancelHint())

    def lost(self) -> None:
        if self.handed is not None:
            self.put(HandOffsHeard(connected=False, lost=True))


class Session:
    """The session connection of one backend (see the module's docstring)."""

    def __init__(self, url: str, channel: str, cancels: str, turns: str) -> None:
        self._url = url
        self._channel = channel
        self._cancels = cancels
        self._turns = turns
        self._listeners: set[_Listener] = set()
        self._locks = 0
        self._channels: set[str] = {turns}
        self._listening: set[str] = set()
        self._conn: AsyncConnection[Any] | None = None
        self._connected = asyncio.Event()
        self.generation = 0
        """Connections made so far: a turn taken on an earlier one is gone."""
        self._given: dict[int, asyncio.Event] = {}
        self._task: asyncio.Task[None] | None = None

    # -- users ---------------------------------------------------------------

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
        listener = _Listener(frozenset(queues), handed, worker)
        wanted = {self._channel, self._cancels} | ({handed} if handed else set())
        self._listeners.add(listener)
        self._channels |= wanted
        try:
            self._start()
            if self._conn is not None and self._connected.is_set():
                with contextlib.suppress(psycopg.Error):
                    await self._listen(self._conn)
                listener.connected()
            while True:
                yield await listener.get()
        finally:
            self._listeners.discard(listener)
            await self._stop_if_unused()

    def turn_lock(self, take_sql: bytes, give_sql: bytes, key: int) -> SessionTurnLock:
        return SessionTurnLock(self, take_sql, give_sql, key)

    async def execute(self, statement: bytes, params: dict[str, Any]) -> tuple[Any, ...] | None:
        """Run ``statement`` on the session connection once it is connected
        (BackendUnavailableError if it is not within ``CONNECTED_WAIT``); a
        failure drops the connection, which reconnects."""
        self._start()
        try:
            async with asyncio.timeout(CONNECTED_WAIT):
                await self._connected.wait()
        except TimeoutError:
            raise BackendUnavailableError("the session connection is not connected") from None
        conn = self._conn
        assert conn is not None
        try:
            cursor = await conn.execute(statement, params)
            return await cursor.fetchone()
        except psycopg.Error:
            self._drop(conn)
            raise

    async def given(self, key: int, timeout: float) -> None:
        """Wait for a notice that the turn ``key`` was given back, or ``timeout``."""
        event = self._given.setdefault(key, asyncio.Event())
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await event.wait()
        event.clear()

    def hold(self) -> None:
        self._locks += 1
        self._start()

    async def release(self) -> None:
        self._locks -= 1
        await self._stop_if_unused()

    async def close(self) -> None:
        """End the connection, whoever still uses it (the backend closes)."""
        self._listeners.clear()
        self._locks = 0
        await self._stop_if_unused()

    # -- the connection --------------------------------------------------------

    def _start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name="conveyor-postgres-session"
            )

    async def _stop_if_unused(self) -> None:
        if self._listeners or self._locks > 0:
            return
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _drop(self, conn: AsyncConnection[Any]) -> None:
        """End ``conn`` (it failed): the reader reconnects."""
        if self._conn is conn:
            self._connected.clear()
            self._conn = None

    async def _listen(self, conn: AsyncConnection[Any]) -> None:
        new = sorted(self._channels - self._listening)
        if new:
            await conn.execute(
                sql.SQL("; ").join(sql.SQL("listen {}").format(sql.Identifier(c)) for c in new)
            )
            self._listening.update(new)

    async def _run(self) -> None:
        outage = Outage(log)
        while True:
            conn: AsyncConnection[Any] | None = None
            try:
                conn = await AsyncConnection.connect(self._url, autocommit=True)
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
                    async for note in conn.notifies(timeout=READ_SLICE):
                        self._dispatch(note)
                    await self._listen(conn)  # channels of listeners added meanwhile
                if not conn.closed:
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
                    listener.put(heard)
            elif note.channel == self._cancels:
                listener.put(CancelHint(int(note.payload) if note.payload.isdigit() else None))
            elif note.channel == self._channel and note.payload in listener.queues:
                listener.put(note.payload)


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
            self._session.hold()
        while True:
            found = await self._session.execute(self._take, self._params)
            if found is not None and found[0]:
                self._held_in = self._session.generation
                return
            await self._session.given(self._key, TURN_RETRY)

    async def give(self) -> None:
        held_in, self._held_in = self._held_in, None
        if held_in is None or held_in != self._session.generation:
            return  # not held, or given back with its session
        await self._session.execute(self._give, self._params)

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.give()
        if self._open:
            self._open = False
            await self._session.release()


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
