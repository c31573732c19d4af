"""Schedules on Redis: script arguments and the read of the stored schedules.

Each schedule is a hash, ``{p}:schedule:NAME``, and its name a member of
``{p}:schedules``. The hash holds ``definition`` (the
:class:`StoredSchedule` fields an app defines, as JSON written here and
read back verbatim: Lua never re-encodes it), ``task``, ``fingerprint`` and
``release`` (which the scripts compare), and ``last_slot``,
``last_task_id`` and ``synced_at`` (ms), which only the scripts write:
``last_slot`` only moves forward, in the script that enqueues the slot's
tasks (``fire_schedule.lua``).

Each release of schedules synced is a hash, ``{p}:schedule-release:NAME``
(``generation``, ``tasks`` as a JSON array, ``seen_at`` in ms), and a member
of ``{p}:schedule-releases`` scored by its ``seen_at``, so that a sync reads
only the live ones; ``{p}:schedule-generations`` holds the last generation
given (see :class:`~conveyor.backends.params.ScheduleSync`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import cast

import redis.asyncio as aioredis

from conveyor.backends.params import ScheduleSync
from conveyor.backends.redis import keys, rows
from conveyor.errors import BackendError
from conveyor.records import StoredSchedule

_DEFINITION = ("name", "task", "cron", "every", "tz", "missed", "catch_up", "args", "fingerprint")


def sync_args(params: ScheduleSync) -> list[str]:
    """The arguments of ``sync_schedules.lua``."""
    lifetime = str(round(params.lifetime * 1000))
    args = [rows.now_arg(params.now), params.release, lifetime, str(len(params.schedules))]
    for given in params.schedules:
        definition = {field: getattr(given, field) for field in _DEFINITION}
        args += [given.name, given.task, given.fingerprint, json.dumps(definition)]
    return [*args, *dict.fromkeys(params.tasks)]


def stored(name: str, fields: Mapping[str, str]) -> StoredSchedule:
    """A schedule's hash; one that does not read raises BackendError."""
    try:
        definition = json.loads(fields["definition"])
        last_slot, last_task = fields.get("last_slot"), fields.get("last_task_id")
        return StoredSchedule(
            **{field: definition[field] for field in _DEFINITION},
            last_slot=None if last_slot is None else rows.moment(int(last_slot)),
            last_task_id=None if last_task is None else int(last_task),
            synced_at=rows.moment(int(fields["synced_at"])),
            release=fields.get("release"),
        )
    except (KeyError, ValueError, TypeError) as exc:
        raise BackendError(
            f"schedule {name!r} is corrupt in Redis: its fields do not read ({exc!r})"
        ) from None


async def listed(client: aioredis.Redis, prefix: str) -> tuple[datetime, list[StoredSchedule]]:
    """The server's now and every stored schedule by name, read together (MULTI)."""
    names = sorted(cast(set[str], await client.smembers(keys.schedules(prefix))))
    async with client.pipeline(transaction=True) as pipe:
        pipe.time()
        for name in names:
            pipe.hgetall(keys.schedule(prefix, name))
        found = await pipe.execute()
    seconds, micros = found[0]
    now = rows.moment(int(seconds) * 1000 + int(micros) // 1000)
    return now, [stored(name, f) for name, f in zip(names, found[1:], strict=True) if f]
