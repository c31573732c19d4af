"""The Lua scripts of the Redis backend: one file per atomic operation.

Each operation's file in ``lua/`` is composed at load after the shared
parts, in order: the table ``TEXTS`` (the attempt log's texts of
:mod:`conveyor.backends.stored`), the key names (written from
:data:`.keys.LAYOUT` by :func:`.keys.lua`), then the library files of
``lua/lib/`` in :data:`LIBRARY`'s order (the call's state and the clock,
the bounds of a task's numbers, indexes and claim order, unique keys,
pauses, concurrency keys and rate limits, state moves, the attempt log,
inboxes, inserts, ends and cancels, retention), read once per process
from the package's files. The composed text is the same in every process
(its SHA names it to the server).
:class:`Scripts` registers them with a client: redis-py's script objects
run them by SHA (EVALSHA) and, when the server does not know a script (a
restart, a SCRIPT FLUSH, another server behind the same address), load it
and run it again; the script text goes over the wire only then.
"""

from __future__ import annotations

import functools
import hashlib
import logging
from collections.abc import Mapping
from importlib import resources
from typing import Any

from redis.asyncio import Redis
from redis.commands.core import AsyncScript
from redis.exceptions import ResponseError

from conveyor.backends.redis import keys
from conveyor.backends.stored import SQL_TEXTS

LIBRARY = (
    "call",
    "numbers",
    "indexes",
    "flow",
    "tasks",
    "attempts",
    "messages",
    "enqueue",
    "controls",
    "maintenance",
)
"""The files of ``lua/lib/`` composed in front of every operation's own, in
this order: each may use what the files before it define."""
OPERATIONS = (
    "open",
    "enqueue",
    "claim",
    "heartbeat",
    "progress",
    "finish",
    "cancel",
    "retry",
    "send",
    "count_unfinished",
    "dependencies",
    "edges",
    "register_worker",
    "stop_worker",
    "pause",
    "resume",
    "run_now",
    "delete",
    "retry_many",
    "cancel_many",
    "delete_many",
    "prune",
    "count_prunable",
    "sync_schedules",
    "fire_schedule",
    "list_keys",
)
"""The operations, each the name of its ``lua/NAME.lua`` file."""
log = logging.getLogger("conveyor.redis")


def _operation(name: str, body: str) -> str:
    """Operation ``name`` as a local function of the shared chunk: it starts
    its call (``begin``, with the store's base) and runs its file's body."""
    return f"local function operation_{name}(KEYS, ARGV)\n  begin(KEYS[1])\n{body}\nend\n"


def _lua_texts() -> str:
    """The texts a script writes in the attempt log (:data:`SQL_TEXTS`), as
    the Lua table ``TEXTS`` composed in front of the shared files: written
    once, in Python, for every backend."""
    entries = []
    for name, text in sorted(SQL_TEXTS.items()):
        if not (text.isascii() and text.isprintable()):
            raise ValueError(f"the text {name!r} must be printable ASCII")
        quoted = text.replace("\\", "\\\\").replace("'", "\\'")
        entries.append(f"  {name} = '{quoted}',\n")
    return "local TEXTS = {\n" + "".join(entries) + "}\n"


@functools.cache
def _texts() -> tuple[str, Mapping[str, str]]:
    """The shared parts, and each operation's own file, as read once."""
    folder = resources.files(__package__) / "lua"
    shared = (
        _lua_texts()
        + keys.lua()
        + "".join(
            (folder / "lib" / f"{name}.lua").read_text(encoding="utf-8") + "\n" for name in LIBRARY
        )
    )
    own = {name: (folder / f"{name}.lua").read_text(encoding="utf-8") for name in OPERATIONS}
    return shared, own


def shared() -> str:
    """The text composed in front of every operation's own: ``TEXTS``, the
    key names, then the library files."""
    return _texts()[0]


@functools.cache
def sources() -> Mapping[str, str]:
    """Each operation's script for EVALSHA: the shared files, then its own
    file as a function that the script calls."""
    shared, own = _texts()
    return {
        name: shared + _operation(name, body) + f"return operation_{name}(KEYS, ARGV)\n"
        for name, body in own.items()
    }


@functools.cache
def library() -> tuple[str, str]:
    """The Redis function library of every operation, and its name
    (``conveyor_`` and a digest of its text: two versions of conveyor on one
    server load two libraries and never call each other's functions). The
    shared files run once, when the library loads; each operation is a
    function named ``LIBRARY_OPERATION``."""
    shared, own = _texts()
    body = shared + "".join(_operation(name, text) for name, text in own.items())
    name = "conveyor_" + hashlib.sha256(body.encode()).hexdigest()[:16]
    registered = "".join(f"redis.register_function('{name}_{op}', operation_{op})\n" for op in own)
    return f"#!lua name={name}\n" + body + registered, name


class Scripts:
    """The operations, registered with one client: as Redis functions
    (FCALL) where the server has them (Redis 7), else as scripts run by SHA.

    A script's text runs whole at every call, the shared files included
    (about 60 µs of server time a call); a function library's runs once, at
    load. :meth:`load` tries the library first and falls back to scripts
    when the server refuses it (no FUNCTION before Redis 7, or an ACL that
    denies it). Either way the server may forget what it was given (a
    restart without persistence, a SCRIPT or FUNCTION FLUSH, another server
    behind the same address): the call that finds it missing loads it again
    and runs once more; the script text goes over the wire only then.
    """

    def __init__(self, client: Redis, *, functions: bool = True) -> None:
        self._client = client
        self._functions = functions
        self._library, self._name = library()
        self._scripts: dict[str, AsyncScript] = {
            name: client.register_script(text) for name, text in sources().items()
        }

    @property
    def functions(self) -> bool:
        """Whether the operations run as Redis functions (after :meth:`load`)."""
        return self._functions

    def sha(self, name: str) -> str:
        """The SHA1 the server knows operation ``name``'s script by."""
        return self._scripts[name].sha

    def function(self, name: str) -> str:
        """The name of operation ``name``'s Redis function."""
        return f"{self._name}_{name}"

    async def load(self) -> None:
        """Load the function library, or settle for scripts when the server
        refuses it."""
        if not self._functions:
            return
        try:
            await self._client.function_load(self._library, replace=True)
        except ResponseError as exc:
            log.debug("Redis functions unavailable (%s); running scripts by SHA", exc)
            self._functions = False

    async def run(self, name: str, base: str, args: list[Any]) -> Any:
        """Run operation ``name`` on the store whose keys start with ``base``."""
        if not self._functions:
            return await self._scripts[name](keys=[base], args=args)
        function = self.function(name)
        try:
            return await self._client.fcall(function, 1, base, *args)
        except ResponseError as exc:
            if not str(exc).startswith("Function not found"):
                raise
        await self._client.function_load(self._library, replace=True)
        return await self._client.fcall(function, 1, base, *args)
