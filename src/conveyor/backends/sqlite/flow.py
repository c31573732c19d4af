"""Flow control on SQLite: pauses, concurrency keys and rate limits (read
and settled by the claim), and schedules.

:class:`FlowControl` is a mixin of
:class:`~conveyor.backends.sqlite.backend.SQLiteBackend`. The claim reads
the paused queues and names in its own write transaction (:func:`served`),
so a pause holds from its commit on.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sqlite3
from collections import Counter
from datetime import datetime
from typing import Any

from conveyor.backends import wake
from conveyor.backends.params import ClaimParams, EnqueueParams, FireParams, ScheduleSync
from conveyor.backends.sqlite import rows
from conveyor.backends.sqlite.database import Database
from conveyor.backends.sqlite.enqueue import insert_tasks
from conveyor.backends.sqlite.statements import SQL, clock
from conveyor.backends.stored import key_scan, schedule_args
from conveyor.model import Pause, PauseKind, check_pause
from conveyor.records import StoredSchedule


def served(conn: sqlite3.Connection, params: ClaimParams) -> ClaimParams:
    """``params`` without the queues and names that are paused."""
    paused = conn.execute(SQL["paused"]).fetchall()
    if not paused:
        return params
    queues = {name for kind, name in paused if kind == PauseKind.QUEUE}
    names = {name for kind, name in paused if kind == PauseKind.TASK}
    return dataclasses.replace(
        params,
        queues=[q for q in params.queues if q not in queues],
        names=[n for n in params.names if n not in names],
    )


def keyed_candidates(
    conn: sqlite3.Connection, scope: dict[str, Any], limit: int
) -> tuple[list[tuple[Any, ...]], dict[str, tuple[float | None, int | None]]]:
    """Due pending tasks of the concurrency keys with room (running tasks
    and rate tokens allowing), each key at most its room, as ``(id, state,
    priority, run_at, key, limit)`` rows; and every key read, with its
    tokens now and its rate (SQLite's one writer: the running tasks counted
    are all of them)."""
    found: list[tuple[Any, ...]] = []
    read: dict[str, tuple[float | None, int | None]] = {}
    scan = {"key_scan": key_scan(limit), "now": scope["now"]}
    for key, room, tokens, rate in conn.execute(SQL["open_keys"], scan).fetchall():
        read[key] = (tokens, rate)
        if tokens is not None:
            room = min(room, math.floor(tokens))
        if room > 0:
            args = {**scope, "key": key, "limit": min(room, limit)}
            found += conn.execute(SQL["claim_keyed"], args).fetchall()
    return found, read


def settle_keys(
    conn: sqlite3.Connection,
    now: float,
    read: dict[str, tuple[float | None, int | None]],
    taken: list[tuple[Any, ...]],
) -> None:
    """After a claim: mark the keys the ``taken`` keyed rows are of (with the
    limit of each one's newest task, and the tokens they spent), drop the
    rows of the other ``read`` keys left with no pending task (a key with a
    rate once its bucket is full)."""
    newest = {row[4]: row[5] for row in sorted(taken, key=lambda row: row[0])}
    spent = Counter(row[4] for row in taken)
    marks = []
    for key, limit in newest.items():
        tokens = read[key][0]
        left = None if tokens is None else tokens - spent[key]
        marks.append({"now": now, "key": key, "max_running": limit, "tokens": left})
    conn.executemany(SQL["key_claimed"], marks)
    idle = [
        key
        for key, (tokens, rate) in read.items()
        if key not in newest and (rate is None or (tokens is not None and tokens >= rate))
    ]
    if idle:
        conn.execute(SQL["keys_emptied"], {"keys": json.dumps(sorted(idle))})


class FlowControl:
    """Pause, resume, list pauses, and sync, list and fire schedules (see
    :class:`~conveyor.backends.protocol.Backend`)."""

    _db: Database
    _wake_key: str

    async def sync_schedules(self, params: ScheduleSync) -> bool:
        def sync(conn: sqlite3.Connection) -> bool:
            now = clock(conn, params.now)
            tasks = json.dumps(list(dict.fromkeys(params.tasks)))
            release = {"release": params.release, "tasks": tasks, "now": now}
            generation = conn.execute(SQL["sync_release"], release).fetchone()[0]
            fence = {**release, "generation": generation, "lifetime": params.lifetime}
            if conn.execute(SQL["release_superseded"], fence).fetchone()[0]:
                return False
            for stored in params.schedules:
                conn.execute(SQL["sync_schedule"], {**schedule_args(stored, now), **fence})
            names = json.dumps([s.name for s in params.schedules])
            conn.execute(SQL["drop_schedules"], {**fence, "names": names})
            return True

        return await self._db.write(sync)

    async def list_schedules(self) -> tuple[datetime, list[StoredSchedule]]:
        def read(conn: sqlite3.Connection) -> tuple[datetime, list[StoredSchedule]]:
            now = rows.moment(clock(conn, None)) or rows.EARLIEST
            return now, [_stored(row) for row in conn.execute(SQL["list_schedules"]).fetchall()]

        return await self._db.read(read)

    async def fire_schedule(self, params: FireParams) -> list[int]:
        if not params.slots:
            return []
        args = {
            "name": params.name,
            "fingerprint": params.fingerprint,
            "first": rows.seconds(params.slots[0]),
            "last": rows.seconds(params.slots[-1]),
        }

        def fire(conn: sqlite3.Connection) -> list[int]:
            if conn.execute(SQL["fire_schedule"], args).fetchone() is None:
                return []
            ids = insert_tasks(conn, EnqueueParams(params.tasks), clock(conn, None))
            if ids:
                conn.execute(SQL["fired_task"], {"name": params.name, "task_id": ids[-1]})
            return ids

        ids = await self._db.write(fire)
        if ids:
            wake.notify(self._wake_key, (t.queue for t in params.tasks))
        return ids

    async def pause(self, kind: PauseKind, name: str, now: datetime | None = None) -> bool:
        kind, name = check_pause(kind, name)

        def pause(conn: sqlite3.Connection) -> bool:
            args = {"kind": kind.value, "name": name, "now": clock(conn, now)}
            return conn.execute(SQL["pause"], args).fetchone() is not None

        return await self._db.write(pause)

    async def resume(self, kind: PauseKind, name: str) -> bool:
        kind, name = check_pause(kind, name)
        args = {"kind": kind.value, "name": name}
        resumed = await self._db.write(
            lambda conn: conn.execute(SQL["resume"], args).fetchone() is not None
        )
        if resumed:
            wake.notify_all(self._wake_key)
        return resumed

    async def list_pauses(self) -> list[Pause]:
        found = await self._db.read(lambda conn: conn.execute(SQL["list_pauses"]).fetchall())
        return [
            Pause(PauseKind(kind), name, rows.moment(at) or rows.EARLIEST)
            for kind, name, at in found
        ]


def _stored(row: tuple[Any, ...]) -> StoredSchedule:
    name, task, cron, every, tz, missed, catch_up, args, fingerprint = row[:9]
    return StoredSchedule(
        name,
        task,
        cron,
        every,
        tz,
        missed,
        catch_up,
        args,
        fingerprint,
        last_slot=rows.moment(row[9]),
        last_task_id=row[10],
        synced_at=rows.moment(row[11]),
        release=row[12],
    )
