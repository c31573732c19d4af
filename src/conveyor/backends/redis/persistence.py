"""What an acknowledged write survives on a Redis server, read from its settings.

A Redis store is as durable as its server's persistence makes it, and only
the server's settings say how durable that is. :func:`read` asks the server
(``CONFIG GET``) at ``open``; :meth:`Persistence.problems` names each setting
that cannot keep conveyor's promise that an acknowledged enqueue, claim or
completion is not lost, and the backend logs them as warnings. Nothing is
refused: a store for tests or for work that may be lost is a fair choice.

- ``appendonly yes`` with ``appendfsync always``: each write is in the
  append-only file, synced to disk, before its reply. A crash of Redis or of
  its machine loses nothing acknowledged. The promise holds.
- ``appendfsync everysec`` (Redis's default once AOF is on): the file is
  written before the reply but synced once a second. A crash of the Redis
  process loses nothing; a crash or power cut of the machine loses up to
  about a second (two, under a slow disk) of acknowledged writes.
- ``appendfsync no``: the kernel syncs when it likes (about every 30 s on
  Linux): a machine crash loses that much.
- ``appendonly no``: only RDB snapshots, if any: a crash loses every write
  since the last snapshot, or everything without snapshots.
- ``maxmemory-policy`` other than ``noeviction``: a full server deletes keys
  to make room, tasks among them. conveyor's keys never expire on their own,
  so only the ``volatile-*`` policies spare them, and only while other keys
  with a time to live remain to evict.

A managed server may refuse ``CONFIG``: the settings are then unknown, and
that is a problem of its own (conveyor cannot tell what it survives).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from redis import exceptions as redis_errors

SETTINGS = ("appendonly", "appendfsync", "maxmemory-policy")


@dataclass(frozen=True)
class Persistence:
    """A server's persistence settings; None where the server would not say."""

    appendonly: str | None
    appendfsync: str | None
    maxmemory_policy: str | None

    def problems(self) -> list[str]:
        """Each setting that can lose acknowledged work, with what it loses
        and the setting that would keep it; empty when nothing can."""
        if self.appendonly is None and self.maxmemory_policy is None:
            return [
                "the server would not show its persistence settings (CONFIG GET refused): "
                "what an acknowledged task survives is unknown; conveyor needs "
                "appendonly yes, appendfsync always and maxmemory-policy noeviction"
            ]
        found = []
        if self.appendonly == "no":
            found.append(
                "appendonly is no: a crash of Redis loses every write since the last "
                "snapshot (set appendonly yes and appendfsync always)"
            )
        elif self.appendfsync == "everysec":
            found.append(
                "appendfsync is everysec: a crash or power cut of the machine loses up to "
                "about a second of acknowledged writes (set appendfsync always)"
            )
        elif self.appendfsync == "no":
            found.append(
                "appendfsync is no: a crash or power cut of the machine loses the writes "
                "the kernel has not synced yet, about 30 s (set appendfsync always)"
            )
        if self.maxmemory_policy not in (None, "noeviction"):
            found.append(
                f"maxmemory-policy is {self.maxmemory_policy}: a full server may evict "
                "conveyor's keys, tasks among them (set maxmemory-policy noeviction)"
            )
        return found


async def read(client: Any) -> Persistence:
    """The settings of the server ``client`` (redis-py's asyncio client) talks to."""
    values: dict[str, str] = {}
    for name in SETTINGS:
        try:
            values.update(await client.config_get(name))
        except redis_errors.ResponseError:  # CONFIG renamed or refused
            continue
    return Persistence(
        appendonly=values.get("appendonly"),
        appendfsync=values.get("appendfsync"),
        maxmemory_policy=values.get("maxmemory-policy"),
    )
