"""The Redis backend: tasks in a Redis server, every state change one Lua script.

Guarantees, as on the other backends: a claim is atomic (each task goes to
one worker per lease; its attempt row exists when the claim returns; expired
leases are reclaimed with the crash budget), heartbeats and completions are
fenced by the lease token (with its claim's random nonce: a server that
lost its data and gives a task id out again never takes an older attempt
for the new task's) and a live lease, and the Redis server's clock
(``TIME``, read inside each script) is the only authority on lease expiry and
due times; a params object's ``now`` overrides it, for tests only. Times are
kept to the millisecond.

Limits, stated plainly:

- Durability is the server's: an acknowledged write survives a crash of
  Redis only as far as its persistence settings (``appendonly``,
  ``appendfsync``) keep it; ``open`` warns of each setting that cannot
  (see :mod:`.persistence`).
- One store is one cluster slot (see :mod:`.keys`); a Redis Cluster client
  is not supported yet.
- What it does: enqueue (with steps, inboxes,
  parents and first messages, and unique keys with their scopes, periods
  and conflicts), claim, heartbeat (which also marks a registered worker
  seen), finish with transitions (a workflow's next step, a coroutine's
  suspend or sleep) and a poll's effects (consumed messages, sends, spawns;
  a child's end message to its parent; cancel cascades), cancel, retry,
  ``run_now``, ``delete``, bulk retries, send (with idempotency keys) and
  ``inbox``, pauses (read by every claim's script), retention (``prune``
  and ``count_prunable``, from an index of finished tasks by finish time),
  the cancel-requested read, ``get_task``, ``count_unfinished``,
  ``next_due_at``, wake-ups (Pub/Sub: ``NOTIFICATIONS``), workers, and the
  inspector (``INSPECT``: ``list_tasks`` from a per-state index,
  ``count_tasks``, ``list_workers`` and ``list_keys``), schedules (sync,
  list, and a fire that moves the last slot in the script that enqueues
  the slots' tasks), and concurrency keys with rate limits.
- Concurrency keys and rate limits hold as on the other backends (the
  memory store is the model; ``lua/lib/flow.lua`` has the design): a claim's
  script reads at most ``max(4 * limit, 16)`` keys, claimed from longest
  ago first, counts each one's running tasks from a sorted set of their
  leases and refills its token bucket from the server's clock, and takes
  at most the room left from the key's own sorted set of due tasks. Scripts
  do not overlap, so two claims never fill one key twice. A full key costs
  a claim its row and its expired leases, never the tasks behind it; a key
  whose due tasks are of other queues or names is walked past them. Unlike
  the SQL backends, a key whose pending tasks are all delayed is read but
  not walked (they join its due set when a claim promotes them).
- ``prune`` takes, within a state, the oldest finish first (ids break
  ties); the other backends take the lowest ids first, so one batch may
  differ from theirs, never what a prune run to the end deletes.
- A unique key is held by its task through ``{p}:unique:...`` (see
  :mod:`.keys`), checked and written by the enqueue's own script: concurrent
  enqueues of one key store one task. A key whose period ended is taken
  over lazily, by the next enqueue that wants it.
- Wake-ups are Pub/Sub, fire-and-forget: one published while a listener is
  reconnecting is lost (it yields every queue when it is back), so workers
  poll as well. Under Redis Cluster, PUBLISH reaches every node (not
  sharded Pub/Sub).
- ``count_tasks`` and a name or queue filter of ``list_tasks`` read task
  hashes one page at a time; no read is an atomic snapshot of the store.
- No transactional enqueue and no attempt transactions: a Redis write cannot
  join a caller's SQL transaction.
- A hash has no column types: every script checks the numbers it reads of
  a task in their bounds before it writes, and a task that does not read
  (written around conveyor) is set aside alone, ended ``failed``
  (``CorruptTask``); reads show it as corrupt (see :mod:`.rows`). A name or
  queue changed to another valid one cannot be told from a real one.

This module wires the sections, each a mixin over the store
(:mod:`.store`: the client, the key prefix, the scripts):
:mod:`.enqueue`, :mod:`.attempts`, :mod:`.messages`, :mod:`.controls`,
:mod:`.flow`, :mod:`.workers`, :mod:`.maintenance`, :mod:`.reads` and
:mod:`.schema`; here are only opening, closing, the capabilities, the
server's clock and the wake-ups (:mod:`.listen`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from datetime import datetime

from conveyor.backends.params import Wakeup
from conveyor.backends.protocol import Capability
from conveyor.backends.redis import connect, keys, listen, rows
from conveyor.backends.redis.attempts import Attempts
from conveyor.backends.redis.controls import Controls
from conveyor.backends.redis.enqueue import Enqueue
from conveyor.backends.redis.flow import FlowControl
from conveyor.backends.redis.maintenance import Maintenance
from conveyor.backends.redis.messages import Messages
from conveyor.backends.redis.reads import Listings
from conveyor.backends.redis.schema import Layout
from conveyor.backends.redis.scripts import Scripts
from conveyor.backends.redis.store import translated
from conveyor.backends.redis.workers import Workers


class RedisBackend(
    Enqueue,
    Attempts,
    Messages,
    Controls,
    FlowControl,
    Workers,
    Maintenance,
    Listings,
    Layout,
):
    """Tasks in Redis (``redis://HOST:PORT/DB``, ``rediss://`` for TLS); all
    keys start with ``{PREFIX}`` (``prefix``, or ``?prefix=`` in the URL;
    default ``conveyor``). See the module docstring for what it guarantees
    and what it does not do yet."""

    capabilities: frozenset[Capability] = frozenset({Capability.NOTIFICATIONS, Capability.INSPECT})

    async def open(self) -> None:
        """Connect, then as ``migrate`` says (see :class:`~.store.RedisStore`):
        mark a new store or convert an older one (:meth:`migrate`), or refuse
        one that is missing or older (:meth:`require_migrated`). Raises
        ConfigurationError for a store written with another layout. No
        connection is left open when it raises."""
        client = connect.client(self._url)
        self._client, self._scripts = client, Scripts(client, functions=self._functions)
        try:
            with translated():
                await self._scripts.load()
            if self._auto_migrate:
                await self.migrate()
            elif self._auto_migrate is False:
                await self.require_migrated()
            await self._check_persistence(client)
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = self._scripts = None

    async def store_clock(self) -> datetime:
        """The server's now (one TIME), to the millisecond as the store keeps time."""
        with translated():
            seconds, micros = await self._redis.time()
        return rows.moment(int(seconds) * 1000 + int(micros) // 1000)

    def wakeups(
        self, queues: Sequence[str], handoffs_for: tuple[str, str] | None = None
    ) -> AsyncIterator[Wakeup]:
        """Pub/Sub on the store's channels, on a connection of its own (see
        :mod:`.listen`): every queue and a cancel hint without an id at each
        (re)connect, then what the scripts publish. A message published while
        the listener is away is lost; workers poll as well."""
        return listen.wakeups(
            self._url, keys.wake_channel(self.prefix), keys.cancel_channel(self.prefix), queues
        )
