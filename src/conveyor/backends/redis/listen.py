"""Wake-ups on Redis: Pub/Sub on the store's wake-up and cancel channels.

The scripts publish, inside the write that causes it, a queue name on
``{p}:wake`` when tasks became due there (once per script and queue) and a
task id on ``{p}:cancel`` when a running task's cancel was requested. Pub/Sub
is fire-and-forget: a message published while no listener is connected is
lost. So the listener, after each (re)connect, yields every queue and a
cancel hint without an id (anything may be due, or to stop, now), and
workers still poll: a wake-up only shortens the wait.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence

from redis import exceptions as redis_errors

from conveyor.backends.params import CancelHint, Wakeup
from conveyor.backends.reconnect import RECONNECT_MAX_DELAY, Outage
from conveyor.backends.redis import connect

log = logging.getLogger("conveyor.redis")


async def wakeups(
    url: str, channel: str, cancels: str, queues: Sequence[str]
) -> AsyncIterator[Wakeup]:
    """Queue names from ``channel`` (only ``queues``), cancel hints from
    ``cancels``, on a connection of its own; reconnects with back-off and
    ends only when the consumer stops iterating."""
    wanted = set(queues)
    outage = Outage(log)
    while True:
        client = connect.listener(url)
        try:
            async with client.pubsub() as pubsub:
                await pubsub.subscribe(channel, cancels)
                confirmed = 0
                while confirmed < 2:  # subscribed before anything is said
                    found = await pubsub.get_message(timeout=RECONNECT_MAX_DELAY)
                    if found is not None and found["type"] == "subscribe":
                        confirmed += 1
                outage.connected()
                for queue in queues:
                    yield queue
                yield CancelHint()
                async for message in pubsub.listen():
                    if message["type"] != "message":
                        continue
                    data = message["data"]
                    if message["channel"] == cancels:
                        yield CancelHint(int(data) if data.isdigit() else None)
                    elif data in wanted:
                        yield data
        except (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError) as exc:
            await outage.lost(exc)
        finally:
            await client.aclose()
