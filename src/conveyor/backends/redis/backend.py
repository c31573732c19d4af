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
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any

from conveyor.backends.params import (
    ClaimedTask,
    ClaimParams,
    Completion,
    EnqueueParams,
    FinishParams,
    FinishResult,
    FireParams,
    HeartbeatParams,
    HeartbeatResult,
    NewTask,
    Wakeup,
)
from conveyor.backends.protocol import Capability
from conveyor.backends.redis import (
    keys,
    listen,
    rows,
)
from conveyor.backends.redis.control import RedisControl
from conveyor.backends.redis.inspector import RedisInspector
from conveyor.backends.redis.store import translated
from conveyor.backends.stored import (
    CANCELLED_MEANWHILE,
    CRASH_BUDGET_SPENT,
    LEASE_EXPIRED,
    LEASE_EXPIRED_ERROR,
    Unread,
    key_scan,
)
from conveyor.errors import (
    BackendError,
    ConfigurationError,
    TaskExistsError,
)
from conveyor.model import (
    LeaseToken,
    Outcome,
    TaskState,
)

log = logging.getLogger("conveyor.redis")

PRIORITY_RANGE = range(-(2**31), 2**31)
"""The priorities the claim order's fixed-width members hold (32-bit, as
``conveyor.options.check_priority`` takes)."""
_FINISH_STATES = frozenset(
    {
        TaskState.SUCCEEDED,
        TaskState.FAILED,
        TaskState.CANCELLED,
        TaskState.PENDING,
        TaskState.WAITING,
    }
)


class RedisBackend(RedisInspector, RedisControl):
    """Tasks in Redis (``redis://HOST:PORT/DB``, ``rediss://`` for TLS); all
    keys start with ``{PREFIX}`` (``prefix``, or ``?prefix=`` in the URL;
    default ``conveyor``). See the module docstring for what it guarantees
    and what it does not do yet."""

    capabilities: frozenset[Capability] = frozenset({Capability.NOTIFICATIONS, Capability.INSPECT})

    async def enqueue(self, params: EnqueueParams) -> list[int]:
        """Store every task in one script, all or none; the ids of the tasks
        it stores ascend in input order, with their first messages (from
        their parent). A task whose unique key a stored task holds is not
        stored: by its ``on_conflict`` the holder's id comes back, a pending
        holder takes its payload, priority and due time, or TaskExistsError
        is raised and nothing of the enqueue is stored (checked in the same
        script, so concurrent enqueues of one key store one task). Raises
        ConfigurationError, storing nothing, for a priority beyond 32 bits."""
        tasks = list(params.tasks)
        if not tasks:
            return []
        for task in tasks:
            _check_new(task)
        args = [rows.now_arg(params.now), rows.tasks_arg(tasks)]
        return _stored_ids(tasks, await self._run("enqueue", args))

    async def enqueue_chunks(self, chunks: Iterable[Sequence[NewTask]]) -> list[int]:
        """Every chunk drawn first, then one script stores them all (all or none)."""
        return await self.enqueue(EnqueueParams.gathered(chunks))

    async def claim(self, params: ClaimParams) -> list[ClaimedTask]:
        """One script (``claim.lua``): see :meth:`Backend.claim`. Every claim
        looks for expired leases of its queues. A task whose stored fields do
        not read is set aside alone (ended failed, ``CorruptTask``): by the
        script, or, for a row that does not decode here, by a completion."""
        if params.limit <= 0 or not params.names or not params.queues:
            return []
        queues = list(dict.fromkeys(params.queues))
        nonce = secrets.token_hex(8)
        args = [
            rows.now_arg(params.now),
            f"{nonce} {params.worker_id}",
            params.limit,
            repr(float(params.lease)),
            LEASE_EXPIRED_ERROR,
            LEASE_EXPIRED,
            CANCELLED_MEANWHILE,
            CRASH_BUDGET_SPENT,
            key_scan(params.limit),
            len(queues),
            *queues,
            *dict.fromkeys(params.names),
        ]
        found = await self._run("claim", args)
        claimed, unread = rows.claimed_tasks(found, params.worker_id, nonce)
        if unread:
            await self._set_aside(unread)
        return claimed

    async def _set_aside(self, unread: Sequence[Unread]) -> None:
        """Claimed rows that do not read end ``failed`` (``CorruptTask``),
        each fenced by its token; one without a token waits out its lease,
        and the claim that meets it sets it aside. Never raises: the rest of
        the claim runs either way."""
        failures = [c for c in (bad.completion() for bad in unread) if c is not None]
        if not failures:
            return
        try:
            await self.finish(FinishParams(failures[0].token.worker_id, failures))
        except Exception as exc:
            log.error("claimed rows that do not read were not set aside: %s", exc)

    async def heartbeat(self, params: HeartbeatParams) -> HeartbeatResult:
        """One script for the batch: each lease renewed if live (its nonce
        too), else lost; a registered worker is marked seen (even with no
        tokens), an unregistered one is told so."""
        tokens = list(params.tokens)
        args: list[Any] = [rows.now_arg(params.now), params.worker_id, repr(float(params.lease))]
        for token in tokens:
            args += [token.task_id, token.attempt, token.nonce]
        *flags, registered = await self._run("heartbeat", args)
        renewed = frozenset(t for t, flag in zip(tokens, flags, strict=True) if flag)
        cancel = frozenset(t for t, flag in zip(tokens, flags, strict=True) if flag == 2)
        return HeartbeatResult(renewed, frozenset(tokens) - renewed, cancel, registered == 1)

    async def cancel_requested(
        self, worker_id: str, tokens: Sequence[LeaseToken]
    ) -> frozenset[LeaseToken]:
        """Reads only: one pipelined HMGET per token."""
        if not tokens:
            return frozenset()
        with translated():
            async with self._redis.pipeline(transaction=False) as pipe:
                for t in tokens:
                    fields = ("attempt", "worker_id", "cancel_requested", "nonce")
                    pipe.hmget(keys.task(self.prefix, t.task_id), *fields)
                found = await pipe.execute()
        return frozenset(
            t
            for t, (attempt, worker, cancel, nonce) in zip(tokens, found, strict=True)
            if attempt == str(t.attempt)
            and worker == worker_id
            and cancel == "1"
            and nonce == t.nonce
        )

    async def finish(self, params: FinishParams) -> FinishResult:
        """One script for the batch (``finish.lua``), each completion fenced
        on its own, with its transition and a poll's effects (see
        :meth:`Backend.finish`). Raises ConfigurationError, writing nothing,
        for a completion that spawns a task with a priority beyond 32 bits."""
        completions = list(params.completions)
        if not completions:
            return FinishResult(frozenset(), frozenset())
        for c in completions:
            _check_completion(c)
        args = [rows.now_arg(params.now), params.worker_id, rows.finish_arg(completions)]
        flags = await self._run("finish", args)
        tokens = [c.token for c in completions]
        applied = frozenset(t for t, flag in zip(tokens, flags, strict=True) if flag)
        return FinishResult(applied, frozenset(tokens) - applied)

    async def fire_schedule(self, params: FireParams) -> list[int]:
        """Enqueue the slots' tasks and move the schedule's last slot in one
        script, if this call takes the slots (see ``fire_schedule.lua``);
        else []. Raises TaskExistsError, storing nothing, as :meth:`enqueue`."""
        slots, tasks = list(params.slots), list(params.tasks)
        if not slots:
            return []
        for task in tasks:
            _check_new(task)
        args = [
            rows.now_arg(None),
            params.name,
            params.fingerprint,
            rows.ms(slots[0]),
            rows.ms(slots[-1]),
            rows.tasks_arg(tasks),
        ]
        return _stored_ids(tasks, await self._run("fire_schedule", args))

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


def _stored_ids(tasks: Sequence[NewTask], found: list[Any]) -> list[int]:
    """The ids an enqueue (or a fire) returned: ``{1, ids...}``; ``{2}``, a
    fire whose slots were not its own; or ``{0, index, holder}``, refused."""
    if found[0] == 2:
        return []
    if not found[0]:
        refused, holder = tasks[int(found[1])], int(found[2])
        if refused.idempotency_key is None:
            raise BackendError("Redis refused a task without a unique key")
        raise TaskExistsError(refused.name, refused.idempotency_key, holder)
    return [int(task_id) for task_id in found[1:]]


def _check_new(task: NewTask) -> None:
    if task.priority not in PRIORITY_RANGE:
        raise ConfigurationError(f"priority must fit in 32 bits, not {task.priority}")


def _check_completion(c: Completion) -> None:
    if c.effects is not None:
        for spawn in c.effects.spawns:
            _check_new(spawn)
    if c.next_state not in _FINISH_STATES:
        raise ConfigurationError(f"no completion of an attempt moves its task to {c.next_state}")
    if c.outcome is Outcome.IN_PROGRESS:
        raise ConfigurationError("a completion's outcome cannot be in_progress")
