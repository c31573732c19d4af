"""One SQLite connection, used from one thread, with conveyor's settings.

sqlite3 calls block, so each backend gives its connection a thread of its
own and the event loop awaits it there: calls of one backend run one at a
time, in order. Several processes (and backends) share one file through
SQLite's own locking: WAL (readers never block the writer), ``busy_timeout``
(a writer waits for the lock instead of failing) and ``BEGIN IMMEDIATE``
for every write (a transaction takes the write lock before reading, so it
never has to upgrade and never fails half-way with SQLITE_BUSY).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import sqlite3
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

from conveyor.backends.refusals import one_line
from conveyor.errors import BackendError, BackendUnavailableError, ConfigurationError

P = ParamSpec("P")
R = TypeVar("R")

MIN_SQLITE_VERSION = (3, 35, 0)
"""RETURNING (3.35) and UPDATE … FROM (3.33) are used throughout."""
DEFAULT_BUSY_TIMEOUT = 10.0
"""Seconds a write waits for another connection's write lock before failing."""
SYNCHRONOUS = {"full": "pragma synchronous = full", "normal": "pragma synchronous = normal"}
"""``full`` (the default) syncs the log at every commit: a committed enqueue or
completion survives a power cut. ``normal`` may lose the last commits on a
power cut (never on a process crash) and is faster."""

UNAVAILABLE_CODES = frozenset(
    {
        sqlite3.SQLITE_BUSY,
        sqlite3.SQLITE_LOCKED,
        sqlite3.SQLITE_NOMEM,
        sqlite3.SQLITE_READONLY,
        sqlite3.SQLITE_IOERR,
        sqlite3.SQLITE_FULL,
        sqlite3.SQLITE_CANTOPEN,
        sqlite3.SQLITE_PROTOCOL,
    }
)
"""SQLite's primary result codes of a store that cannot serve now: the file
locked by another connection (busy, locked), out of memory, read-only (its
permissions or its directory's), an I/O error, a full disk, a file that
cannot be opened (see :func:`translated_errors`)."""


def check_version() -> None:
    if sqlite3.sqlite_version_info < MIN_SQLITE_VERSION:
        raise ConfigurationError(
            f"SQLite {sqlite3.sqlite_version} is too old: conveyor needs "
            f"{'.'.join(map(str, MIN_SQLITE_VERSION))} or newer"
        )


def connect(path: str, busy_timeout: float, synchronous: str) -> sqlite3.Connection:
    """A connection in autocommit mode (transactions are explicit), WAL on."""
    if synchronous not in SYNCHRONOUS:
        raise ConfigurationError(f"synchronous must be one of {', '.join(SYNCHRONOUS)}")
    try:
        conn = sqlite3.connect(
            path, timeout=busy_timeout, isolation_level=None, check_same_thread=False
        )
        _wal(conn, busy_timeout)
        conn.execute(SYNCHRONOUS[synchronous])
        conn.execute("pragma foreign_keys = on")
        # A cancelled coroutine cancels its children, and theirs (migration 0003).
        conn.execute("pragma recursive_triggers = on")
    except sqlite3.Error as exc:
        raise BackendUnavailableError(f"cannot open SQLite database {path!r}: {exc}") from exc
    return conn


WAL_RETRY = 0.01
"""Seconds between tries of switching a file to WAL while another
connection holds it (see :func:`_wal`)."""


def _wal(conn: sqlite3.Connection, busy_timeout: float) -> None:
    """Put the file in WAL mode. Switching a new file needs it alone, and
    SQLite answers "database is locked" at once, without its busy handler,
    while another process or thread opens the same new file: tried again
    until ``busy_timeout`` has passed, as any other write waits."""
    deadline = time.monotonic() + busy_timeout
    while True:
        try:
            conn.execute("pragma journal_mode = wal")
            return
        except sqlite3.OperationalError as exc:
            if not unavailable(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(WAL_RETRY)


def unavailable(exc: sqlite3.Error) -> bool:
    """Whether ``exc`` says the store cannot serve now (its result code is
    one of ``UNAVAILABLE_CODES``), rather than that it refuses for good."""
    code = getattr(exc, "sqlite_errorcode", None)
    return code is not None and code & 0xFF in UNAVAILABLE_CODES


@contextlib.contextmanager
def translated_errors() -> Iterator[None]:
    """sqlite3 errors as conveyor's, by SQLite's result code, not by the
    driver's class or the message's words: a lock held too long, a failing
    or full disk, a file that cannot be opened is BackendUnavailableError
    (worth retrying); anything else (a constraint, a value too big, a
    datatype mismatch, a corrupt file, a value the driver cannot bind) is a
    permanent BackendError. The message is one line (see
    :mod:`conveyor.backends.refusals`)."""
    try:
        yield
    except sqlite3.Error as exc:
        if unavailable(exc):
            raise BackendUnavailableError(f"SQLite is unavailable: {one_line(str(exc))}") from exc
        raise BackendError(f"SQLite refused the statement: {one_line(str(exc))}") from exc


@contextlib.contextmanager
def immediate(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """A write transaction that holds the write lock from its first statement."""
    conn.execute("begin immediate")
    try:
        yield conn
    except BaseException:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("rollback")
        raise
    conn.execute("commit")


class Database:
    """A connection and the one thread that uses it."""

    def __init__(self, path: str, busy_timeout: float, synchronous: str) -> None:
        self.path = path
        self._busy_timeout = busy_timeout
        self._synchronous = synchronous
        self._conn: sqlite3.Connection | None = None
        self._thread: ThreadPoolExecutor | None = None

    async def open(self) -> None:
        """Connect in the connection's own thread; when that fails (the file
        locked, unreadable, not a database), the thread is ended too."""
        if self._thread is None:
            self._thread = ThreadPoolExecutor(1, thread_name_prefix="conveyor-sqlite")
        if self._conn is None:
            try:
                self._conn = await self._in_thread(
                    connect, self.path, self._busy_timeout, self._synchronous
                )
            except BaseException:
                await self.close()
                raise

    async def close(self) -> None:
        thread, self._thread = self._thread, None
        conn, self._conn = self._conn, None
        if thread is None:
            return
        if conn is not None:
            with contextlib.suppress(Exception):
                await asyncio.get_running_loop().run_in_executor(thread, conn.close)
        thread.shutdown(wait=False)

    async def _in_thread(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        if self._thread is None:
            raise BackendError("the backend is not open")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._thread, functools.partial(fn, *args, **kwargs))

    def _with_errors(self, fn: Callable[[sqlite3.Connection], R]) -> R:
        conn = self._conn
        if conn is None:
            raise BackendError("the backend is not open")
        with translated_errors():
            return fn(conn)

    async def read(self, fn: Callable[[sqlite3.Connection], R]) -> R:
        """Run ``fn(connection)`` in the connection's thread, outside a transaction."""
        return await self._in_thread(self._with_errors, fn)

    async def write(self, fn: Callable[[sqlite3.Connection], R]) -> R:
        """Run ``fn(connection)`` in the connection's thread, in BEGIN IMMEDIATE."""

        def transaction(conn: sqlite3.Connection) -> R:
            with immediate(conn):
                return fn(conn)

        return await self._in_thread(self._with_errors, transaction)
