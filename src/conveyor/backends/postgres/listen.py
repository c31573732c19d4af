"""Wake-ups on PostgreSQL: LISTEN on the wake-up and cancel channels.

One connection of its own listens to both channels, and to the worker's
hand-off channel when it is given one. A queue name on the wake-up channel
says work may be due there; a task id on the cancel channel says that
task's cancel may have been requested; a notice on the hand-off channel is
a task leased to the worker (see :mod:`.handoffs`). The listener reconnects
on its own, with back-off, and after each (re)connect yields every queue, a
cancel hint without an id and (with a hand-off channel) HandOffsHeard:
anything sent while it was not listening may be due, or to stop, or
handed off, now.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence

import psycopg
from psycopg import AsyncConnection, sql

from conveyor.backends.params import CancelHint, HandOffsHeard, Wakeup
from conveyor.backends.postgres import handoffs
from conveyor.backends.reconnect import Outage

log = logging.getLogger("conveyor.postgres")


async def wakeups(
    url: str,
    channel: str,
    cancels: str,
    queues: Sequence[str],
    handoffs_for: tuple[str, str] | None = None,
) -> AsyncIterator[Wakeup]:
    """Queue names from ``channel`` (only ``queues``), cancel hints from
    ``cancels``, and the hand-offs to the worker process ``handoffs_for``
    (its id and nonce, if given) from its own channel; ends only when the
    consumer stops iterating. A notice that does not read (written around
    conveyor) is logged and passed by: its task runs again when its lease
    expires."""
    wanted = set(queues)
    channels = [channel, cancels]
    handed, worker = None, ""
    if handoffs_for is not None:
        worker, nonce = handoffs_for
        handed = handoffs.channel(channel, worker, nonce)
        channels.append(handed)
    listen = sql.SQL("; ").join(
        sql.SQL("listen {}").format(sql.Identifier(name)) for name in channels
    )
    outage = Outage(log)
    while True:
        try:
            conn = await AsyncConnection.connect(url, autocommit=True)
            async with conn:
                await conn.execute(listen)
                outage.connected()
                if handoffs_for is not None:
                    yield HandOffsHeard()
                for queue in queues:
                    yield queue
                yield CancelHint()
                async for note in conn.notifies():
                    if note.channel == handed:
                        heard = _handed_off(note.payload, worker)
                        if heard is not None:
                            yield heard
                    elif note.channel == cancels:
                        yield CancelHint(int(note.payload) if note.payload.isdigit() else None)
                    elif note.payload in wanted:
                        yield note.payload
        except psycopg.Error as exc:
            if handed is not None:
                yield HandOffsHeard(connected=False, lost=True)
            await outage.lost(exc)


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
