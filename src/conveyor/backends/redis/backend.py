"""The Redis backend: tasks in a Redis server, every state change one Lua script.

Guarantees, as on the other backends: a claim is atomic (each task goes to
one worker per lease; its attempt row exists when the claim returns; expired
leases are reclaimed with the crash budget), heartbeats and completions are
fenced by the lease token and a live lease, and the Redis server's clock
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
  memory store is the model; ``lua/keys.lua`` has the design): a claim's
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
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from datetime import datetime
from typing import Any, cast
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis.asyncio as aioredis
from redis import exceptions as redis_errors

from conveyor.backends.protocol import (
    Capability,
    ClaimedTask,
    ClaimParams,
    Completion,
    EnqueueParams,
    FinishParams,
    FinishResult,
    FireParams,
    HeartbeatParams,
    HeartbeatResult,
    KeyInfo,
    Migration,
    NewTask,
    PruneParams,
    PruneResult,
    RetryMany,
    ScheduleSync,
    SendParams,
    StoredSchedule,
    TaskCount,
    TaskFilter,
    Wakeup,
    WorkerInfo,
    WorkFilter,
)
from conveyor.backends.redis import (
    concurrency,
    connect,
    keys,
    listen,
    persistence,
    reads,
    rows,
    schedules,
)
from conveyor.backends.redis.scripts import Scripts
from conveyor.backends.stored import (
    CANCELLED_MEANWHILE,
    CRASH_BUDGET_SPENT,
    LEASE_EXPIRED,
    LEASE_EXPIRED_ERROR,
    check_recipient,
    delete_refused,
    key_scan,
    transition_result,
)
from conveyor.errors import (
    BackendError,
    BackendUnavailableError,
    ConfigurationError,
    TaskExistsError,
)
from conveyor.model import (
    Attempt,
    LeaseToken,
    Message,
    Outcome,
    Pause,
    PauseKind,
    Task,
    TaskState,
    check_pause,
)

SCHEMES = ("redis", "rediss")
_CHECKED: set[str] = set()
"""The servers whose persistence this process has checked (host:port)."""
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


class RedisBackend:
    """Tasks in Redis (``redis://HOST:PORT/DB``, ``rediss://`` for TLS); all
    keys start with ``{PREFIX}`` (``prefix``, or ``?prefix=`` in the URL;
    default ``conveyor``). See the module docstring for what it guarantees
    and what it does not do yet."""

    capabilities: frozenset[Capability] = frozenset({Capability.NOTIFICATIONS, Capability.INSPECT})

    def __init__(self, url: str, *, prefix: str | None = None, **_options: Any) -> None:
        parts = urlsplit(url)
        if parts.scheme.lower() not in SCHEMES:
            raise ConfigurationError(f"a Redis URL starts with redis:// or rediss://, not {url!r}")
        query = dict(parse_qsl(parts.query))
        in_url = query.pop("prefix", None)
        if prefix is not None and in_url is not None and prefix != in_url:
            raise ConfigurationError(
                f"two key prefixes: {in_url!r} in the URL and {prefix!r} as an option"
            )
        self.prefix = keys.check_prefix(prefix or in_url or keys.DEFAULT_PREFIX)
        self._base = keys.base(self.prefix)
        self._url = urlunsplit(parts._replace(query=urlencode(query)))
        host = parts.hostname or "localhost"
        port = f":{parts.port}" if parts.port else ""
        self._server = f"{host}{port}"
        self._location = f"{parts.scheme}://{host}{port}{parts.path or '/0'}?prefix={self.prefix}"
        self._client: aioredis.Redis | None = None
        self._scripts: Scripts | None = None

    @property
    def location(self) -> str:
        return self._location

    # -- connection ------------------------------------------------------

    async def open(self) -> None:
        """Connect, and mark a new store with this layout's version, or
        convert one of a layout this one upgrades (:data:`keys.UPGRADED`,
        ``lua/open.lua``). Raises ConfigurationError for a store written with
        another layout. No connection is left open when it raises."""
        client = connect.client(self._url)
        self._client, self._scripts = client, Scripts(client)
        try:
            found = await self._run("open", [keys.LAYOUT_VERSION, *sorted(keys.UPGRADED)])
            if found != keys.LAYOUT_VERSION:
                raise ConfigurationError(
                    f"the Redis store {self.location} has key layout {found!r}; "
                    f"this conveyor reads layout {keys.LAYOUT_VERSION!r}"
                )
            await self._check_persistence(client)
        except BaseException:
            await self.close()
            raise

    async def _check_persistence(self, client: aioredis.Redis) -> None:
        """Warn, once per process and server, of each persistence setting
        that can lose acknowledged work (see :mod:`.persistence`); a read
        that fails is tried again at the next ``open``."""
        if self._server in _CHECKED:
            return
        with _translated():
            found = await persistence.read(client)
        _CHECKED.add(self._server)
        for problem in found.problems():
            log.warning("Redis at %s: %s", self._server, problem)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = self._scripts = None

    async def migrate(self) -> list[int]:
        """Nothing to migrate: the layout version is written at ``open``."""
        return []

    async def destroy(self) -> None:
        """Delete every key of this store (those of its prefix), found with
        SCAN: the only operation that walks the key space."""
        client = self._redis
        with _translated():
            batch: list[str] = []
            async for key in client.scan_iter(match=keys.pattern(self.prefix), count=1000):
                batch.append(key)
                if len(batch) >= 1000:
                    await client.unlink(*batch)
                    batch = []
            if batch:
                await client.unlink(*batch)

    @property
    def _redis(self) -> aioredis.Redis:
        if self._client is None:
            raise ConfigurationError("the Redis backend is not open: call open() first")
        return self._client

    async def _run(self, name: str, args: list[Any]) -> Any:
        if self._scripts is None:
            raise ConfigurationError("the Redis backend is not open: call open() first")
        with _translated():
            return await self._scripts.run(name, self._base, args)

    # -- enqueue ---------------------------------------------------------

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

    # -- claim, heartbeat, finish ----------------------------------------

    async def claim(self, params: ClaimParams) -> list[ClaimedTask]:
        """One script (``claim.lua``): see :meth:`Backend.claim`. Every claim
        looks for expired leases of its queues."""
        if params.limit <= 0 or not params.names or not params.queues:
            return []
        queues = list(dict.fromkeys(params.queues))
        args = [
            rows.now_arg(params.now),
            params.worker_id,
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
        return rows.claimed_tasks(found, params.worker_id)

    async def heartbeat(self, params: HeartbeatParams) -> HeartbeatResult:
        """One script for the batch: each lease renewed if live, else lost;
        a registered worker is marked seen (even with no tokens)."""
        tokens = list(params.tokens)
        args: list[Any] = [rows.now_arg(params.now), params.worker_id, repr(float(params.lease))]
        for token in tokens:
            args += [token.task_id, token.attempt]
        flags = await self._run("heartbeat", args)
        renewed = frozenset(t for t, flag in zip(tokens, flags, strict=True) if flag)
        cancel = frozenset(t for t, flag in zip(tokens, flags, strict=True) if flag == 2)
        return HeartbeatResult(renewed, frozenset(tokens) - renewed, cancel)

    async def cancel_requested(
        self, worker_id: str, tokens: Sequence[LeaseToken]
    ) -> frozenset[LeaseToken]:
        """Reads only: one pipelined HMGET per token."""
        if not tokens:
            return frozenset()
        with _translated():
            async with self._redis.pipeline(transaction=False) as pipe:
                for t in tokens:
                    fields = ("attempt", "worker_id", "cancel_requested")
                    pipe.hmget(keys.task(self.prefix, t.task_id), *fields)
                found = await pipe.execute()
        return frozenset(
            t
            for t, (attempt, worker, cancel) in zip(tokens, found, strict=True)
            if attempt == str(t.attempt) and worker == worker_id and cancel == "1"
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

    # -- control ---------------------------------------------------------

    async def cancel(self, task_id: int, now: datetime | None = None) -> TaskState:
        changed, current = await self._run("cancel", [rows.now_arg(now), task_id])
        return transition_result(task_id, "cancel", changed or None, current or None)

    async def retry(self, task_id: int, now: datetime | None = None) -> TaskState:
        changed, current = await self._run("retry", [rows.now_arg(now), task_id])
        return transition_result(task_id, "retry", changed or None, current or None)

    async def run_now(self, task_id: int, now: datetime | None = None) -> TaskState:
        """A pending task becomes due now (never later) and its queue is
        woken. Raises TaskNotFoundError, or InvalidTransitionError for a
        task in any other state."""
        changed, current = await self._run("run_now", [rows.now_arg(now), task_id])
        return transition_result(task_id, "run now", changed or None, current or None)

    async def delete(self, task_id: int) -> None:
        """Delete a task with its attempt log, inbox, send keys and unique
        key (one script); its children lose their parent. Raises
        TaskNotFoundError, or InvalidTransitionError for a running task or
        an unfinished child of a live parent (nothing deleted)."""
        found = await self._run("delete", [task_id])
        if not found[0]:
            raise delete_refused(task_id, found[1] or None, found[2] or None)

    async def retry_many(self, selection: RetryMany) -> list[int]:
        """One batch of a bulk retry in one script (``retry_many.lua``, which
        says what it costs): the ids retried, ascending."""
        args = [
            rows.now_arg(selection.now),
            selection.after,
            selection.limit,
            rows.opt(selection.name),
            rows.opt(selection.queue),
            rows.opt(None if selection.since is None else rows.ms(selection.since)),
            rows.opt(None if selection.until is None else rows.ms(selection.until)),
            *dict.fromkeys(state.value for state in selection.states),
        ]
        return [int(task_id) for task_id in await self._run("retry_many", args)]

    # -- reads -----------------------------------------------------------

    async def get_task(self, task_id: int, with_attempts: bool = True) -> Task | None:
        """The task and its attempt log, read together (MULTI). Raises
        BackendError for a task whose stored fields do not read."""
        with _translated():
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.hgetall(keys.task(self.prefix, task_id))
                if with_attempts:
                    pipe.lrange(keys.attempts(self.prefix, task_id), 0, -1)
                found = await pipe.execute()
        if not found[0]:
            return None
        attempts: tuple[Attempt, ...] = ()
        if with_attempts:
            attempts = rows.attempts(task_id, found[0], found[1])
        return rows.task(task_id, found[0], attempts)

    async def list_tasks(self, task_filter: TaskFilter) -> list[Task]:
        """Tasks newest first, filtered and paged as :class:`TaskFilter`
        says, without attempt logs: served by the per-state index when the
        filter names a state, else by the index of every task; a name or
        queue filter is applied to what the index gives (see
        :func:`.reads.list_tasks` for its cost)."""
        with _translated():
            return await reads.list_tasks(self._redis, self.prefix, task_filter)

    async def count_tasks(self) -> list[TaskCount]:
        """Tasks by state, queue and name: reads every task's three fields,
        pipelined, as :meth:`Inspector.count_tasks` allows."""
        with _translated():
            return await reads.count_tasks(self._redis, self.prefix)

    async def list_workers(self) -> list[WorkerInfo]:
        """Every registered worker, live or stopped, newest start first."""
        with _translated():
            return await reads.list_workers(self._redis, self.prefix)

    async def list_keys(self, limit: int = 1000, now: datetime | None = None) -> list[KeyInfo]:
        """The concurrency keys that hold tasks back, by key, at most
        ``limit`` (one script, reads only; it reads every key row). Unique
        keys are not listed here, on any backend."""
        found = await self._run("list_keys", [rows.now_arg(now)])
        return concurrency.listed(found, limit)

    async def count_prunable(self, params: PruneParams) -> PruneResult:
        """What :meth:`prune` would delete over all its batches (one script,
        reads only)."""
        found = await self._run("count_prunable", rows.prune_args(params)[1:])
        return PruneResult(tasks=int(found[0]), workers=int(found[1]))

    async def pending_migrations(self) -> list[Migration]:
        """None: a Redis store has no migrations (its layout version is
        checked at ``open``)."""
        return []

    async def count_unfinished(self, work: WorkFilter) -> int:
        queues = list(dict.fromkeys(work.queues))
        if not queues or not work.names:
            return 0
        args = [rows.now_arg(work.now), len(queues), *queues, *dict.fromkeys(work.names)]
        return int(await self._run("count_unfinished", args))

    async def next_due_at(self, queues: Sequence[str]) -> datetime | None:
        """The earliest run time of a pending task of these queues: the head
        of each queue's pending set, read in one pipelined round trip."""
        wanted = list(dict.fromkeys(queues))
        if not wanted:
            return None
        with _translated():
            async with self._redis.pipeline(transaction=False) as pipe:
                for queue in wanted:
                    pipe.zrange(keys.pending(self.prefix, queue), 0, 0, withscores=True)
                heads = await pipe.execute()
        found = [int(score) for head in heads for _, score in head]
        return rows.moment(min(found)) if found else None

    # -- messages ----------------------------------------------------------

    async def send(self, params: SendParams) -> list[int]:
        """Deliver every message in one script (``send.lua``), all or none,
        and return their ids (ascending in send order). Raises
        TaskNotFoundError, NoInboxError or TaskFinishedError, sending
        nothing, for a recipient that cannot take a message; a delivery
        whose idempotency key its recipient was sent under already returns
        the first message's id and delivers nothing. Idempotency keys are
        kept as long as their recipient (deleted or pruned with it)."""
        deliveries = list(params.deliveries)
        if not deliveries:
            return []
        found = await self._run("send", [rows.now_arg(params.now), *rows.send_args(deliveries)])
        if not found[0]:
            _, task_id, state, inbox = found
            check_recipient(int(task_id), state or None, inbox == "1")
            raise BackendError(f"Redis refused a send to task {task_id} without a reason")
        return [int(message_id) for message_id in found[1:]]

    async def inbox(self, task_id: int) -> list[Message]:
        """The task's unread messages, oldest first (one ZRANGE); [] for a
        task without messages or without an inbox. Raises BackendError for a
        message that does not read."""
        with _translated():
            found = cast(
                list[str], await self._redis.zrange(keys.inbox(self.prefix, task_id), 0, -1)
            )
        return [rows.message(task_id, text) for text in found]

    # -- retention -----------------------------------------------------------

    async def prune(self, params: PruneParams) -> PruneResult:
        """Delete one batch in one script (``prune.lua``): finished tasks past
        their state's cutoff, at most ``limit``, state by state in the order
        given, each with its attempt log, inbox, send keys and unique key,
        never a child of a live parent; and old workers. Within a state the
        oldest *finish* goes first (ids break ties): the other backends take
        the lowest ids first, so one batch may differ from theirs, never
        what a prune run to the end deletes. Never ``busy``: scripts do not
        overlap."""
        found = await self._run("prune", rows.prune_args(params))
        return PruneResult(tasks=int(found[0]), workers=int(found[1]))

    # -- schedules -----------------------------------------------------------

    async def sync_schedules(self, params: ScheduleSync) -> None:
        """Store an app's schedules in one script (see :class:`ScheduleSync`)."""
        await self._run("sync_schedules", schedules.sync_args(params))

    async def list_schedules(self) -> tuple[datetime, list[StoredSchedule]]:
        """The server's now and every stored schedule by name (one MULTI)."""
        with _translated():
            return await schedules.listed(self._redis, self.prefix)

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

    # -- pauses --------------------------------------------------------------

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
        with _translated():
            found = cast(dict[str, str], await self._redis.hgetall(keys.pauses(self.prefix)))
        listed = [rows.pause(field, at) for field, at in found.items()]
        return sorted(listed, key=lambda p: (p.kind.value, p.name))

    # -- workers -------------------------------------------------------------

    async def register_worker(self, info: WorkerInfo) -> None:
        """Record the worker as started and seen at the server's now, not
        stopped (one script). Kept until a prune with ``workers_before``."""
        await self._run("register_worker", [rows.now_arg(None), *rows.worker_args(info)])

    async def stop_worker(self, worker_id: str) -> None:
        """Mark a registered worker stopped (an unknown id changes nothing)."""
        await self._run("stop_worker", [rows.now_arg(None), worker_id])

    # -- wake-ups ----------------------------------------------------------

    def wakeups(self, queues: Sequence[str]) -> AsyncIterator[Wakeup]:
        """Pub/Sub on the store's channels, on a connection of its own (see
        :mod:`.listen`): every queue and a cancel hint without an id at each
        (re)connect, then what the scripts publish. A message published while
        the listener is away is lost; workers poll as well."""
        return listen.wakeups(
            self._url, keys.wake_channel(self.prefix), keys.cancel_channel(self.prefix), queues
        )


@contextlib.contextmanager
def _translated() -> Iterator[None]:
    """redis-py's errors as conveyor's: no connection (or a server still
    loading its data) is BackendUnavailableError, worth retrying; a script or
    command the server refused is BackendError."""
    try:
        yield
    except (redis_errors.ConnectionError, redis_errors.TimeoutError) as exc:
        raise BackendUnavailableError(f"Redis is unavailable: {exc}") from exc
    except redis_errors.RedisError as exc:
        raise BackendError(f"Redis refused the operation: {exc}") from exc


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
