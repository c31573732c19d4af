"""Wake-ups on PostgreSQL: LISTEN on the wake-up and cancel channels.

One connection of its own listens to both channels. A queue name on the
wake-up channel says work may be due there; a task id on the cancel channel
says that task's cancel may have been requested. The listener reconnects on
its own, with back-off, and after each (re)connect yields every queue and
a cancel hint without an id: anything sent while it was not listening may
be due, or to stop, now.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence

import psycopg
from psycopg import AsyncConnection, sql

from conveyor.backends.protocol import CancelHint, Wakeup
from conveyor.backends.reconnect import Outage

log = logging.getLogger("conveyor.postgres")


async def wakeups(
    url: str, channel: str, cancels: str, queues: Sequence[str]
) -> AsyncIterator[Wakeup]:
    """Queue names from ``channel`` (only ``queues``), cancel hints from
    ``cancels``; ends only when the consumer stops iterating."""
    wanted = set(queues)
    listen = sql.SQL("listen {}; listen {}").format(
        sql.Identifier(channel), sql.Identifier(cancels)
    )
    outage = Outage(log)
    while True:
        try:
            conn = await AsyncConnection.connect(url, autocommit=True)
            async with conn:
                await conn.execute(listen)
                outage.connected()
                for queue in queues:
                    yield queue
                yield CancelHint()
                async for note in conn.notifies():
                    if note.channel == cancels:
                        yield CancelHint(int(note.payload) if note.payload.isdigit() else None)
                    elif note.payload in wanted:
                        yield note.payload
        except psycopg.Error as exc:
            await outage.lost(exc)
