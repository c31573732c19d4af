"""Flow control on Redis: pauses, schedules, and what concurrency keys and
rate limits hold back.

A mixin of :class:`~conveyor.backends.redis.backend.RedisBackend`. Pauses
are one hash (``{p}:pauses``), read by every claim's script; pausing and
resuming are one script each.

Each schedule is a hash, ``{p}:schedule:NAME``, and its name a member of
``{p}:schedules``. The hash holds ``definition`` (the
:class:`StoredSchedule` fields an app defines, as JSON written here and
read back verbatim: Lua never re-encodes it), ``task``, ``fingerprint`` and
``release`` (which the scripts compare), and ``last_slot``,
``last_task_id`` and ``synced_at`` (ms), which only the scripts write:
``last_slot`` only moves forward, in the script that enqueues the slot's
tasks (``fire_schedule.lua``). Each release of schedules synced is a hash,
``{p}:schedule-release:NAME`` (``generation``, ``tasks`` as a JSON array,
``seen_at`` in ms), and a member of ``{p}:schedule-releases`` scored by its
``seen_at``, so that a sync reads only the live ones;
``{p}:schedule-generations`` holds the last generation given (see
:class:`~conveyor.backends.params.ScheduleSync`).

Concurrency keys and rate limits are enforced by the claim's script; their
design is in ``lua/lib/flow.lua`` (and the layout in :mod:`.keys`): a row
per key with pending tasks (or a refilling rate bucket), each key's due
tasks in a sorted set of their own (out of their queues' ready sets), and
its running tasks by lease expiry, so that a claim reads a full key's row
and never the tasks queued behind it. The memory store is the model.
:func:`listed_keys` reads what ``list_keys.lua`` returns as
:class:`~conveyor.records.KeyInfo`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, cast

import redis.asyncio as aioredis

from conveyor.backends.params import FireParams, ScheduleSync
from conveyor.backends.redis import keys, rows
from conveyor.backends.redis.enqueue import check_new, stored_ids
from conveyor.backends.redis.store import RedisStore, translated
from conveyor.errors import BackendError
from conveyor.model import Pause, PauseKind, check_pause
from conveyor.records import KeyInfo, StoredSchedule

_DEFINITION = ("name", "task", "cron", "every", "tz", "missed", "catch_up", "args", "fingerprint")


class FlowControl(RedisStore):
    """Schedules and pauses."""

    async def sync_schedules(self, params: ScheduleSync) -> bool:
        """Store an app's schedules in one script (see :class:`ScheduleSync`)."""
        return bool(await self._run("sync_schedules", sync_args(params)))

    async def list_schedules(self) -> tuple[datetime, list[StoredSchedule]]:
        """The server's now and every stored schedule by name (one MULTI)."""
        with translated():
            return await _stored_schedules(self._redis, self.prefix)

    async def fire_schedule(self, params: FireParams) -> list[int]:
        """Enqueue the slots' tasks and move the schedule's last slot in one
        script, if this call takes the slots (see ``fire_schedule.lua``);
        else []. Raises TaskExistsError, storing nothing, as :meth:`enqueue`."""
        slots, tasks = list(params.slots), list(params.tasks)
        if not slots:
            return []
        for task in tasks:
            check_new(task)
        args = [
            rows.now_arg(None),
            params.name,
            params.fingerprint,
            rows.ms(slots[0]),
            rows.ms(slots[-1]),
            rows.tasks_arg(tasks),
        ]
        return stored_ids(tasks, await self._run("fire_schedule", args))

    async def pause(self, kind: PauseKind, name: str, now: datetime | None = None) -> bool:
        """Hold a queue or task name back from every claim and reclaim (each
        claim's script reads the pauses); False if it was paused already.
        Raises ConfigurationError for a bad kind or name."""
        kind, name = check_pause(kind, name)
        return bool(await self._run("pause", [rows.now_arg(now), kind.value, name]))

    async def resume(self, kind: PauseKind, name: str) -> bool:
        """Undo a pause and wake the queues it held back (see ``resume.lua``);
        False if it was not paused."""
        kind, name = check_pause(kind, name)
        return bool(await self._run("resume", [kind.value, name]))

    async def list_pauses(self) -> list[Pause]:
        """Every pause, by kind then name (one HGETALL)."""
        with translated():
            found = cast(dict[str, str], await self._redis.hgetall(keys.pauses(self.prefix)))
        listed = [rows.pause(field, at) for field, at in found.items()]
        return sorted(listed, key=lambda p: (p.kind.value, p.name))


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


async def _stored_schedules(
    client: aioredis.Redis, prefix: str
) -> tuple[datetime, list[StoredSchedule]]:
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


def listed_keys(found: Sequence[Any], limit: int) -> list[KeyInfo]:
    """The reply of ``list_keys.lua`` (``{now, rows...}``): the keys by key,
    at most ``limit``, with when each rate's next token comes (None while one
    is there). A row that does not read raises BackendError."""
    now = rows.moment(int(found[0]))
    chosen = sorted(found[1:], key=lambda row: str(row[0]))[: max(limit, 0)]
    return [_key_info(row, now) for row in chosen]


def _key_info(row: Sequence[Any], now: Any) -> KeyInfo:
    key, max_running, running, pending, rate, period, tokens = row
    try:
        rate_limit = int(rate) if rate != "" else None
        rate_period = float(period) if period != "" else None
        left = float(tokens) if tokens != "" else None
        upcoming = None
        if left is not None and left < 1 and rate_limit and rate_period:
            upcoming = now + timedelta(seconds=(1 - left) * rate_period / rate_limit)
        return KeyInfo(
            key,
            int(max_running),
            int(running),
            int(pending),
            rate_limit,
            rate_period,
            left,
            upcoming,
        )
    except ValueError:
        raise BackendError(f"concurrency key {key!r} is corrupt in Redis: {row!r}") from None
