"""The Lua scripts of the Redis backend: one file per atomic operation.

Each operation's file in ``lua/`` is composed at load after the shared
files, in order: ``common.lua`` (key names, the clock, claim order, the
attempt log, inserts, inboxes, wakes, ends and cancels) and ``keys.lua``
(concurrency keys and rate limits), read once per process from the
package's files.
:class:`Scripts` registers them with a client: redis-py's script objects
run them by SHA (EVALSHA) and, when the server does not know a script (a
restart, a SCRIPT FLUSH, another server behind the same address), load it
and run it again; the script text goes over the wire only then.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from importlib import resources
from typing import Any

from redis.asyncio import Redis
from redis.commands.core import AsyncScript

SHARED = ("common", "keys")
"""The files composed in front of every operation's own, in this order."""
OPERATIONS = (
    "open",
    "enqueue",
    "claim",
    "heartbeat",
    "finish",
    "cancel",
    "retry",
    "send",
    "count_unfinished",
    "register_worker",
    "stop_worker",
    "pause",
    "resume",
    "run_now",
    "delete",
    "retry_many",
    "prune",
    "count_prunable",
    "sync_schedules",
    "fire_schedule",
    "list_keys",
)
"""The operations, each the name of its ``lua/NAME.lua`` file."""


@functools.cache
def sources() -> Mapping[str, str]:
    """Each operation's full script text: the shared files, then its own."""
    folder = resources.files(__package__) / "lua"
    shared = "".join((folder / f"{name}.lua").read_text(encoding="utf-8") + "\n" for name in SHARED)
    return {
        name: shared + (folder / f"{name}.lua").read_text(encoding="utf-8") for name in OPERATIONS
    }


class Scripts:
    """The operations' scripts, registered with one client."""

    def __init__(self, client: Redis) -> None:
        self._scripts: dict[str, AsyncScript] = {
            name: client.register_script(text) for name, text in sources().items()
        }

    def sha(self, name: str) -> str:
        """The SHA1 the server knows operation ``name``'s script by."""
        return self._scripts[name].sha

    async def run(self, name: str, base: str, args: list[Any]) -> Any:
        """Run operation ``name`` on the store whose keys start with ``base``."""
        return await self._scripts[name](keys=[base], args=args)
