"""What only the Redis backend has: functions, or scripts run by SHA, the server's clock,
key prefixes, and how it reads a corrupt task.

The common contract is in tests/conformance/, run against every backend.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from conveyor import payload as codec
from conveyor.backends.params import (
    ClaimParams,
    Completion,
    Delivery,
    EnqueueParams,
    ErrorInfo,
    FinishParams,
    HeartbeatParams,
    NewTask,
    ScheduleSync,
    SendParams,
    WorkFilter,
)
from conveyor.backends.redis import RedisBackend, keys, rows
from conveyor.backends.redis.scripts import OPERATIONS
from conveyor.errors import BackendError, ConfigurationError, TaskNotFoundError
from conveyor.model import Outcome, PauseKind, TaskState
from conveyor.records import PruneParams, TaskFilter, WorkerInfo
from tests.conformance.test_inboxes import coroutine, rest
from tests.conformance.test_schedules import SCHEDULE
from tests.conformance.test_tasks import LEASE, T0, claim, enqueue, later, new, success
from tests.conftest import REDIS_URL
from tools.redis_server import RedisServer


@pytest.fixture
async def raw() -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(REDIS_URL, decode_responses=True)
    yield client
    await client.aclose()


@pytest.fixture
async def store() -> AsyncIterator[RedisBackend]:
    instance = RedisBackend(REDIS_URL, prefix=f"t_{uuid.uuid4().hex[:12]}")
    await instance.open()
    yield instance
    await instance.destroy()
    await instance.close()


async def own_keys(client: aioredis.Redis, prefix: str) -> list[str]:
    return [key async for key in client.scan_iter(match="{" + prefix + "}:*")]


@pytest.fixture
def private(tmp_path: Path) -> Iterator[RedisServer]:
    """A Redis server of the test's own: flushing its functions or scripts
    touches no other test's."""
    server = RedisServer(tmp_path / "redis", appendonly=False)
    server.start()
    yield server
    server.stop()


async def library_functions(client: aioredis.Redis) -> set[str]:
    """The names of the functions of every library the server holds."""
    names: set[str] = set()
    for library in await client.function_list():
        fields = dict(zip(library[::2], library[1::2], strict=True))
        for function in fields["functions"]:
            names.add(dict(zip(function[::2], function[1::2], strict=True))["name"])
    return names


async def test_operations_run_as_functions_and_survive_a_function_flush(
    private: RedisServer,
) -> None:
    raw = aioredis.Redis.from_url(private.url, decode_responses=True)
    store = RedisBackend(private.url, prefix="t")
    await store.open()
    try:
        assert store._scripts is not None and store._scripts.functions
        [task_id] = await enqueue(store, new())
        assert await library_functions(raw) == {
            store._scripts.function(name) for name in OPERATIONS
        }
        await raw.function_flush()
        assert await library_functions(raw) == set()
        # The server forgot the library: the next call loads it again and runs.
        [claimed] = await claim(store)
        assert claimed.token.task_id == task_id
        assert store._scripts.function("claim") in await library_functions(raw)
    finally:
        await store.close()
        await raw.aclose()


async def test_scripts_run_by_sha_and_survive_a_script_flush(private: RedisServer) -> None:
    raw = aioredis.Redis.from_url(private.url, decode_responses=True)
    store = RedisBackend(private.url, prefix="t", functions=False)
    await store.open()
    try:
        assert store._scripts is not None and not store._scripts.functions
        assert await library_functions(raw) == set()
        shas = [store._scripts.sha(name) for name in OPERATIONS]
        [task_id] = await enqueue(store, new())
        assert (await raw.script_exists(store._scripts.sha("enqueue"))) == [True]
        await raw.script_flush()
        assert not any(await raw.script_exists(*shas))
        # The server forgot every script: the next call loads its own and runs.
        [claimed] = await claim(store)
        assert claimed.token.task_id == task_id
        assert (await raw.script_exists(store._scripts.sha("claim"))) == [True]
    finally:
        await store.close()
        await raw.aclose()


async def test_a_server_that_refuses_functions_gets_scripts(raw: aioredis.Redis) -> None:
    """An ACL user without FUNCTION (as a server before Redis 7 has none)."""
    user = f"conveyor_{uuid.uuid4().hex[:8]}"
    await raw.acl_setuser(
        user,
        enabled=True,
        passwords=["+secret"],
        keys=["*"],
        channels=["*"],
        commands=["+@all", "-function"],
    )
    prefix = f"t_{uuid.uuid4().hex[:12]}"
    url = REDIS_URL.replace("redis://", f"redis://{user}:secret@")
    store = RedisBackend(url, prefix=prefix)
    try:
        await store.open()
        assert store._scripts is not None and not store._scripts.functions
        [task_id] = await enqueue(store, new())
        [claimed] = await claim(store)
        assert claimed.token.task_id == task_id
        await store.destroy()
    finally:
        await store.close()
        await raw.acl_deluser(user)


async def test_times_come_from_the_server_clock_without_an_injected_now(
    store: RedisBackend, raw: aioredis.Redis
) -> None:
    seconds, micros = await raw.time()
    before = datetime.fromtimestamp(seconds, UTC) + timedelta(microseconds=micros)
    [task_id] = await store.enqueue(EnqueueParams([new(run_at=None)]))
    # No now anywhere: the task is due at the server's now, not at the test's T0.
    [claimed] = await store.claim(
        ClaimParams(worker_id="w1", names=["job"], queues=["default"], limit=1, lease=LEASE)
    )
    task = await store.get_task(task_id)
    assert task is not None
    after = datetime.now(UTC) + timedelta(seconds=1)
    floor = before - timedelta(milliseconds=1)
    assert floor <= task.created_at <= after
    assert floor <= task.attempts[0].started_at <= after
    assert claimed.lease_expires_at - task.attempts[0].started_at == timedelta(seconds=LEASE)


async def test_destroy_deletes_exactly_its_prefix(raw: aioredis.Redis) -> None:
    """A prefix with glob characters matches only itself; a neighbour whose
    name it would match as a pattern keeps its keys."""
    stem = f"t_{uuid.uuid4().hex[:12]}"
    mine = RedisBackend(REDIS_URL, prefix=stem + "*")
    await mine.open()
    await enqueue(mine, new(), new(run_at=None))
    neighbours = ["{" + stem + "x}:task:1", "{" + stem + "}:task:1", stem + "*:task:1"]
    try:
        await raw.mset(dict.fromkeys(neighbours, "keep"))
        assert await own_keys(raw, stem + "\\*")
        await mine.destroy()
        assert await own_keys(raw, stem + "\\*") == []
        assert await raw.exists(*neighbours) == len(neighbours)
    finally:
        await raw.delete(*neighbours)
        await mine.destroy()
        await mine.close()


async def test_a_task_hash_missing_a_field_reads_as_corrupt_and_is_set_aside(
    store: RedisBackend, raw: aioredis.Redis
) -> None:
    stateless, counterless, healthy = await enqueue(store, new(), new(priority=9), new())
    await raw.hdel(f"{{{store.prefix}}}:task:{stateless}", "state")
    read = await store.get_task(stateless)
    assert read is not None and read.payload["corrupt"] == ["its field 'state' is missing"]
    # A claim that meets a task whose fields do not read sets it aside (out
    # of the claim order, into the corrupt set, ended failed) instead of
    # failing: it blocks nothing behind it, and is claimed never again.
    await raw.hdel(f"{{{store.prefix}}}:task:{counterless}", "attempt")
    await raw.hdel(f"{{{store.prefix}}}:task:{stateless}", "spent")
    assert [c.token.task_id for c in await claim(store)] == [healthy]
    assert await claim(store) == []
    assert await raw.smembers(f"{{{store.prefix}}}:corrupt") == {
        str(stateless),
        str(counterless),
    }
    task = await store.get_task(counterless)
    assert task is not None and task.state is TaskState.FAILED
    assert task.payload["corrupt"] == ["its field 'attempt' is missing"]
    assert task.attempts[-1].error_type == "CorruptTask"


async def test_a_priority_beyond_32_bits_is_refused_and_stores_nothing(
    store: RedisBackend,
) -> None:
    with pytest.raises(ConfigurationError, match="priority must fit in 32 bits"):
        await store.enqueue(EnqueueParams([new(), new(priority=2**31)]))
    assert await store.list_tasks(TaskFilter()) == []


async def test_a_heartbeat_and_a_finish_of_no_tokens_write_nothing(store: RedisBackend) -> None:
    beat = await store.heartbeat(HeartbeatParams("w1", [], LEASE))
    assert beat.renewed == beat.lost == frozenset()
    done = await store.finish(FinishParams("w1", []))
    assert done.applied == done.rejected == frozenset()


async def test_a_poll_spawning_what_cannot_be_stored_is_refused_before_any_write(
    store: RedisBackend,
) -> None:
    [parent, peer] = await enqueue(store, coroutine(), coroutine())
    [polled] = await claim(store, names=("coro",), limit=1)
    seen = await store.inbox(parent)
    poll = rest(
        polled,
        {"n": 1},
        consumed=tuple(m.id for m in seen),
        sends=(Delivery(peer, codec.encode("hi"), parent),),
        spawns=(new(priority=-(2**31) - 1),),
    )
    with pytest.raises(ConfigurationError, match="32 bits"):
        await store.finish(FinishParams("w1", [poll]))
    task = await store.get_task(parent)
    assert task is not None and task.state is TaskState.IN_PROGRESS
    assert await store.inbox(parent) == seen and await store.inbox(peer) == []
    assert [t.id for t in await store.list_tasks(TaskFilter())] == [peer, parent]


async def test_an_inbox_message_that_does_not_read_is_a_typed_error(
    store: RedisBackend, raw: aioredis.Redis
) -> None:
    [task_id] = await enqueue(store, coroutine(message={"n": 1}))
    [first] = await store.inbox(task_id)
    assert first.body == {"n": 1} and first.sender_id is None
    await raw.zadd(f"{{{store.prefix}}}:inbox:{task_id}", {"not json": first.id + 1})
    with pytest.raises(BackendError, match=f"task {task_id} .*message of its inbox"):
        await store.inbox(task_id)


async def test_send_keys_live_per_recipient_and_a_refusal_writes_nothing(
    store: RedisBackend, raw: aioredis.Redis
) -> None:
    [a, b] = await enqueue(store, coroutine(), coroutine())
    keyed = [
        Delivery(a, codec.encode(1), idempotency_key="k"),
        Delivery(b, codec.encode(2), None, "k"),
    ]
    first = await store.send(SendParams(keyed, now=T0))
    assert await store.send(SendParams(keyed, now=T0)) == first  # same key, same ids
    assert await raw.hgetall(f"{{{store.prefix}}}:sent:{a}") == {"k": str(first[0])}
    ids_before = await raw.get(f"{{{store.prefix}}}:message-ids")
    with pytest.raises(TaskNotFoundError):
        await store.send(SendParams([Delivery(a, codec.encode(3)), Delivery(999, "1")]))
    assert await raw.get(f"{{{store.prefix}}}:message-ids") == ids_before
    assert [m.body for m in await store.inbox(a)] == [1]


def test_urls_and_prefixes() -> None:
    backend = RedisBackend("rediss://:secret@example.com:6380/2?prefix=jobs")
    assert backend.prefix == "jobs"
    assert backend.location == "rediss://example.com:6380/2?prefix=jobs"
    assert "secret" not in backend.location
    with pytest.raises(ConfigurationError, match="braces"):
        RedisBackend(REDIS_URL, prefix="a{b}")
    with pytest.raises(ConfigurationError, match="two key prefixes"):
        RedisBackend(REDIS_URL + "?prefix=a", prefix="b")
    with pytest.raises(ConfigurationError, match="redis://"):
        RedisBackend("postgresql://localhost/db")


async def state_index(raw: aioredis.Redis, prefix: str) -> dict[str, set[int]]:
    found = {}
    for state in TaskState:
        ids = await raw.zrange(f"{{{prefix}}}:state:{state.value}", 0, -1)
        if ids:
            found[state.value] = {int(i) for i in ids}
    return found


async def test_the_state_index_follows_every_move(store: RedisBackend, raw: aioredis.Redis) -> None:
    """Each task is in exactly the index of its state, through claims,
    completions, a suspend and a wake, cancels (cascading) and retries."""
    [parent, plain, doomed] = await enqueue(store, coroutine(), new(), new())
    await store.cancel(doomed, now=T0)
    [polled] = await claim(store, names=("coro",), limit=1)
    child = replace(new(), parent_id=parent)
    await store.finish(FinishParams("w1", [rest(polled, {}, spawns=(child,))], now=T0))
    ran = await claim(store, limit=2)  # the plain task and the child
    await store.finish(FinishParams("w1", [success(r.token) for r in ran], now=T0))
    await store.retry(doomed, now=T0)
    tasks = {t.id: t.state.value for t in await store.list_tasks(TaskFilter())}
    expected: dict[str, set[int]] = {}
    for task_id, state in tasks.items():
        expected.setdefault(state, set()).add(task_id)
    assert await state_index(raw, store.prefix) == expected
    assert tasks[parent] == "pending"  # woken by its child's end message
    assert await store.cancel(parent, now=T0) is TaskState.CANCELLED
    tasks = {t.id: t.state.value for t in await store.list_tasks(TaskFilter())}
    assert {i for i, s in tasks.items() if s == "cancelled"} == (
        await state_index(raw, store.prefix)
    )["cancelled"]
    assert plain in tasks


async def test_workers_are_registered_seen_and_stopped(store: RedisBackend) -> None:
    info = WorkerInfo("w1", "host", 42, ("default",), 4, tasks=("job",), beat_seconds=1.5)
    await store.register_worker(info)
    await store.register_worker(replace(info, id="w2", beat_seconds=None))
    [newest, first] = await store.list_workers()
    assert {newest.id, first.id} == {"w1", "w2"}
    w1 = next(w for w in (newest, first) if w.id == "w1")
    assert (w1.host, w1.pid, w1.queues, w1.concurrency, w1.tasks, w1.beat_seconds) == (
        "host",
        42,
        ("default",),
        4,
        ("job",),
        1.5,
    )
    assert w1.started_at is not None and w1.stopped_at is None
    await store.heartbeat(HeartbeatParams("w1", [], LEASE))
    await store.stop_worker("w1")
    await store.stop_worker("nobody")
    stopped = next(w for w in await store.list_workers() if w.id == "w1")
    assert stopped.stopped_at is not None and stopped.last_seen_at == stopped.stopped_at
    assert len(await store.list_workers()) == 2


async def test_next_due_at_is_the_earliest_pending_run_time(store: RedisBackend) -> None:
    assert await store.next_due_at(["default", "mail"]) is None
    soon, later_, _mail = await enqueue(
        store,
        new(run_at=T0 + timedelta(seconds=5)),
        new(run_at=T0 + timedelta(seconds=50)),
        new(queue="mail", run_at=T0 + timedelta(seconds=1)),
    )
    assert await store.next_due_at(["default"]) == T0 + timedelta(seconds=5)
    assert await store.next_due_at(["default", "mail"]) == T0 + timedelta(seconds=1)
    [claimed] = await claim(store, at=T0 + timedelta(seconds=5))  # promoted, then claimed
    assert claimed.token.task_id == soon
    assert await store.next_due_at(["default"]) == T0 + timedelta(seconds=50)
    await store.cancel(later_, now=T0)
    assert await store.next_due_at(["default"]) is None
    retry = Completion(claimed.token, Outcome.FAILED, TaskState.PENDING, retry_delay=0.0)
    await store.finish(FinishParams("w1", [retry], now=T0))  # due again at once
    assert await store.next_due_at(["default"]) == T0


async def test_prune_leaves_no_key_of_its_tasks_behind(
    store: RedisBackend, raw: aioredis.Redis
) -> None:
    """A pruned task takes every key stored for it: hash, attempt log,
    inbox, send keys, unique key, children and index entries."""
    before = set(await own_keys(raw, store.prefix))
    [parent] = await enqueue(store, replace(coroutine(message={"n": 1}), idempotency_key="k"))
    [child] = await enqueue(store, replace(new("kid"), parent_id=parent))
    await store.send(SendParams([Delivery(parent, codec.encode(2), idempotency_key="s")]))
    [taken] = await claim(store, names=("kid",))
    await store.finish(FinishParams("w1", [success(taken.token)], now=T0 + timedelta(seconds=1)))
    await store.cancel(parent, now=T0 + timedelta(seconds=2))
    cutoff = T0 + timedelta(seconds=10)
    params = PruneParams({TaskState.SUCCEEDED: cutoff, TaskState.CANCELLED: cutoff})
    assert (await store.prune(params)).tasks == 2
    left = set(await own_keys(raw, store.prefix)) - before
    base = "{" + store.prefix + "}"
    # What may stay: counters, and sets of queues and names ever used.
    assert {k for k in left if str(parent) in k.split(":") or str(child) in k.split(":")} == set()
    assert not any(
        k.startswith((f"{base}:unique", f"{base}:finished", f"{base}:state")) for k in left
    )
    assert await store.list_tasks(TaskFilter()) == []


async def test_unique_keys_of_names_with_colons_do_not_collide(
    store: RedisBackend, raw: aioredis.Redis
) -> None:
    """The name's length is in the key, so ("a:b", "c") and ("a", "b:c"),
    or a non-ASCII name, hold keys of their own."""
    ids = await enqueue(
        store,
        replace(new("a:b"), idempotency_key="c"),
        replace(new("a"), idempotency_key="b:c"),
        replace(new("é"), idempotency_key="c"),
    )
    assert len(set(ids)) == 3
    assert await raw.get(keys.unique(store.prefix, "é", "c")) == str(ids[2])
    assert await enqueue(store, replace(new("é"), idempotency_key="c")) == [ids[2]]


async def test_concurrent_enqueues_of_one_key_store_one_task(store: RedisBackend) -> None:
    callers = [RedisBackend(REDIS_URL, prefix=store.prefix) for _ in range(8)]
    for caller in callers:
        await caller.open()
    try:
        keyed = replace(new(), idempotency_key="race")
        found = await asyncio.gather(*(c.enqueue(EnqueueParams([keyed])) for c in callers))
        assert len({ids[0] for ids in found}) == 1
        assert len(await store.list_tasks(TaskFilter())) == 1
    finally:
        for caller in callers:
            await caller.close()


async def test_a_store_of_an_older_layout_is_refused(raw: aioredis.Redis) -> None:
    prefix = f"t_{uuid.uuid4().hex[:12]}"
    await raw.set(keys.layout(prefix), "2")
    try:
        with pytest.raises(ConfigurationError, match="layout '2'"):
            await RedisBackend(REDIS_URL, prefix=prefix).open()
    finally:
        await raw.delete(keys.layout(prefix))


async def test_a_pause_is_a_field_of_one_hash(store: RedisBackend, raw: aioredis.Redis) -> None:
    await store.pause(PauseKind.TASK, "a:b", now=T0)
    await store.pause(PauseKind.QUEUE, "mail", now=T0)
    assert await raw.hgetall(keys.pauses(store.prefix)) == {
        "task:a:b": str(rows.ms(T0)),
        "queue:mail": str(rows.ms(T0)),
    }
    assert [(p.kind, p.name) for p in await store.list_pauses()] == [
        (PauseKind.QUEUE, "mail"),
        (PauseKind.TASK, "a:b"),
    ]


async def test_a_schedule_is_a_hash_and_one_that_does_not_read_is_a_typed_error(
    store: RedisBackend, raw: aioredis.Redis
) -> None:
    await store.sync_schedules(ScheduleSync([SCHEDULE], tasks=["job"], now=T0))
    assert await raw.smembers(keys.schedules(store.prefix)) == {"nightly"}
    stored = await raw.hgetall(keys.schedule(store.prefix, "nightly"))
    assert (stored["last_slot"], stored["fingerprint"]) == (str(rows.ms(T0)), "f1")
    await raw.hset(keys.schedule(store.prefix, "nightly"), "definition", "{")
    with pytest.raises(BackendError, match="schedule 'nightly' is corrupt"):
        await store.list_schedules()


async def test_a_store_of_layout_3_is_marked_with_this_layout(raw: aioredis.Redis) -> None:
    """A layout 3 store has no running attempt in a hash to convert, and is
    marked with this layout when opened."""
    prefix = f"t_{uuid.uuid4().hex[:12]}"
    await raw.set(keys.layout(prefix), "3")
    instance = RedisBackend(REDIS_URL, prefix=prefix)
    try:
        await instance.open()
        assert await raw.get(keys.layout(prefix)) == keys.LAYOUT_VERSION == "5"
    finally:
        await instance.destroy()
        await instance.close()


async def test_a_layout_4_store_s_running_attempts_move_into_their_hashes(
    store: RedisBackend, raw: aioredis.Redis
) -> None:
    """Layout 4 kept the running attempt as the last row of the log (and an
    index of every task): opening such a store moves the row into the hash
    (and deletes the index), and the attempt then ends as any other (its row
    written once, complete)."""
    [running, ended] = await enqueue(store, new(), new())
    claimed = await claim(store, limit=2)
    [token] = [c.token for c in claimed if c.token.task_id == ended]
    await store.finish(FinishParams("w1", [success(token)], now=T0))
    # Written back as layout 4 wrote it: the running row last in the log.
    task_key = keys.task(store.prefix, running)
    started = await raw.hget(task_key, "started_at")
    await raw.hdel(task_key, "started_at")
    row = {"number": 1, "worker_id": "w1", "outcome": "in_progress", "started_at": int(started)}
    await raw.rpush(keys.attempts(store.prefix, running), json.dumps(row))
    await raw.zadd(f"{keys.base(store.prefix)}:tasks", {str(running): running, str(ended): ended})
    await raw.set(keys.layout(store.prefix), "4")
    ended_log = await raw.lrange(keys.attempts(store.prefix, ended), 0, -1)
    reopened = RedisBackend(REDIS_URL, prefix=store.prefix)
    await reopened.open()
    try:
        assert await raw.get(keys.layout(store.prefix)) == "5"
        assert await raw.exists(f"{keys.base(store.prefix)}:tasks") == 0
        assert await raw.llen(keys.attempts(store.prefix, running)) == 0
        assert await raw.lrange(keys.attempts(store.prefix, ended), 0, -1) == ended_log
        found = await reopened.get_task(running)
        assert found is not None
        [attempt] = found.attempts
        assert (attempt.number, attempt.outcome, attempt.started_at) == (1, Outcome.IN_PROGRESS, T0)
        [token] = [c.token for c in claimed if c.token.task_id == running]
        result = await reopened.finish(FinishParams("w1", [success(token)], now=later(1)))
        assert result.applied == {token}
        found = await reopened.get_task(running)
        assert found is not None
        [attempt] = found.attempts
        assert (attempt.outcome, attempt.started_at, attempt.finished_at) == (
            Outcome.SUCCEEDED,
            T0,
            later(1),
        )
    finally:
        await reopened.close()


async def test_a_running_task_whose_start_does_not_read_is_set_aside_at_its_completion(
    store: RedisBackend, raw: aioredis.Redis
) -> None:
    """The running attempt lives in the hash: a completion whose fence holds
    but whose start does not read is rejected, and its task set aside: it
    ends failed, its attempt log saying why."""
    [task_id] = await enqueue(store, new())
    [claimed] = await claim(store)
    await raw.hset(keys.task(store.prefix, task_id), "started_at", "soon")
    result = await store.finish(FinishParams("w1", [success(claimed.token)], now=T0))
    assert result.rejected == {claimed.token}
    assert await raw.smembers(f"{keys.base(store.prefix)}:corrupt") == {str(task_id)}
    task = await store.get_task(task_id)
    assert task is not None and task.state is TaskState.FAILED
    last = task.attempts[-1]
    assert (last.number, last.error_type) == (1, "CorruptTask")
    assert "started_at" in (last.error_message or "")


def keyed(key: str, limit: int = 1, **fields: object) -> NewTask:
    return replace(new(**fields), concurrency_key=key, concurrency_limit=limit)  # type: ignore[arg-type]


async def test_a_full_key_costs_a_claim_nothing_of_the_tasks_behind_it(
    store: RedisBackend, raw: aioredis.Redis
) -> None:
    """The tasks behind a key are in the key's own sorted set, out of the
    queue's ready sets; while the key is full a claim does not read that
    set at all: a member that does not read, put at its front, is met (and
    dropped) only once the key has room again."""
    held = await enqueue(store, *(keyed("hot") for _ in range(1000)))
    [plain] = await enqueue(store, new())
    first = await claim(store, limit=10)
    assert sorted(c.token.task_id for c in first) == [held[0], plain]
    ready = keys.concurrency_ready(store.prefix, "hot")
    assert await raw.zcard(ready) == 999
    assert await raw.scard(keys.concurrency_pending(store.prefix, "hot")) == 999
    assert await raw.zcard(keys.concurrency_leases(store.prefix, "hot")) == 1
    assert await store.count_unfinished(WorkFilter(["job"], ["default"], now=T0)) == 1001
    # A member sorting first among the 999 (the claim order of the task
    # running, which left the set), in no format a claim reads.
    [head] = await raw.zrange(ready, 0, 0)
    poison = head[:42].replace(f"{held[1]:015d}", f"{held[0]:015d}") + "|?"
    assert poison < head
    await raw.zadd(ready, {poison: 0})
    for at in (1, 2, 3):
        assert await claim(store, limit=10, at=T0 + timedelta(seconds=at)) == []
    assert await raw.zscore(ready, poison) == 0
    [running] = [c for c in first if c.token.task_id == held[0]]
    await store.finish(FinishParams("w1", [success(running.token)], now=T0 + timedelta(seconds=4)))
    [second] = await claim(store, limit=10, at=T0 + timedelta(seconds=5))
    assert second.token.task_id == held[1]
    assert await raw.zscore(ready, poison) is None
    assert await raw.zcard(ready) == 998


async def test_a_drained_key_leaves_no_key_behind(store: RedisBackend, raw: aioredis.Redis) -> None:
    """A key's row goes with the claim that reads it with no pending task
    left; its sets go as they empty (a rate's row once its bucket is full)."""
    before = set(await own_keys(raw, store.prefix))
    rated = replace(keyed("r", limit=2), rate_limit=1, rate_period=10.0)
    await enqueue(store, keyed("k", limit=2), keyed("k", limit=2), rated)
    taken = await claim(store, limit=10)
    assert len(taken) == 3
    done = [success(c.token) for c in taken]
    await store.finish(FinishParams("w1", done, now=T0 + timedelta(seconds=1)))
    assert await claim(store, limit=10, at=T0 + timedelta(seconds=2)) == []
    left = {k for k in set(await own_keys(raw, store.prefix)) - before if "concurrency" in k}
    assert left == {keys.concurrency(store.prefix, "r"), keys.concurrency_keys(store.prefix)}
    [listed] = await store.list_keys(now=T0 + timedelta(seconds=2))
    assert (listed.key, listed.pending, listed.tokens) == ("r", 0, pytest.approx(0.2))
    assert await claim(store, limit=10, at=T0 + timedelta(seconds=30)) == []
    left = {k for k in set(await own_keys(raw, store.prefix)) - before if "concurrency" in k}
    assert left == set()
    assert await store.list_keys(now=T0 + timedelta(seconds=30)) == []


def test_a_redis_url_builds_the_redis_backend_with_its_prefix() -> None:
    from conveyor.backends import backend_from_url

    plain = backend_from_url("redis://127.0.0.1:6379/2")
    assert isinstance(plain, RedisBackend) and plain.prefix == keys.DEFAULT_PREFIX
    assert backend_from_url("rediss://cache.example:6380/0?prefix=shop").location == (
        "rediss://cache.example:6380/0?prefix=shop"
    )
    # The App's schema (or CONVEYOR_SCHEMA) names the prefix, as the URL's does.
    named = backend_from_url("redis://127.0.0.1:6379/0", schema="billing")
    assert isinstance(named, RedisBackend) and named.prefix == "billing"
    with pytest.raises(ConfigurationError, match="two key prefixes"):
        backend_from_url("redis://127.0.0.1:6379/0?prefix=a", schema="b")
    with pytest.raises(ConfigurationError, match="braces"):
        backend_from_url("redis://127.0.0.1:6379/0", schema="a{b}")


def test_without_redis_py_a_redis_url_says_which_extra_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sys

    from conveyor.backends import backend_from_url

    for name in [
        m
        for m in sys.modules
        if m == "redis" or m.startswith(("redis.", "conveyor.backends.redis"))
    ]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "redis", None)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"pip install 'conveyor\[redis\]'"):
        backend_from_url("redis://127.0.0.1:6379/0")


async def test_an_app_on_a_redis_url_runs_its_tasks() -> None:
    import conveyor
    from tests.conftest import REDIS_URL, drop_redis_prefix
    from tests.worker.helpers import run_all

    prefix = f"t_{uuid.uuid4().hex[:12]}"
    app = conveyor.App(f"{REDIS_URL}?prefix={prefix}")

    @app.task()
    async def add(a: int, b: int) -> int:
        return a + b

    try:
        async with app:
            handle = await add.enqueue_async(a=2, b=3)
            [task] = await run_all(app, [handle])
    finally:
        app.close()
        drop_redis_prefix(prefix)
    assert task.state is TaskState.SUCCEEDED and task.result == 5


def test_the_redis_extra_brings_the_c_reply_parser() -> None:
    """redis-py parses replies in C with hiredis (the ``redis`` extra asks
    for it): in pure Python, parsing a claim's reply cost a worker a third
    of its time."""
    from redis.utils import HIREDIS_AVAILABLE

    assert HIREDIS_AVAILABLE


async def test_every_key_of_a_store_is_in_one_cluster_slot(
    store: RedisBackend, raw: aioredis.Redis
) -> None:
    """What Redis Cluster needs of a store, checkable on one server: after
    every kind of write, each key the store holds carries its hash tag, so
    all hash to one slot (and each script touches that slot only)."""
    from redis.crc import key_slot

    unique = replace(new(), idempotency_key="u1", unique_scope="active")
    limited = replace(new(), concurrency_key="k1", concurrency_limit=1, rate_limit=5)
    limited = replace(limited, rate_period=60.0)
    ids = await enqueue(store, new(), unique, limited, new(run_at=T0 + timedelta(hours=1)))
    [coro] = await enqueue(store, coroutine({}))
    message = Delivery(coro, codec.encode({"n": 1}), idempotency_key="m1")
    await store.send(SendParams([message], now=T0))
    claimed = await claim(store, limit=10, names=("job", "coro"))
    done = [success(c.token) for c in claimed if c.token.task_id == ids[0]]
    await store.finish(FinishParams(worker_id="w1", completions=done, now=T0))
    await store.pause(PauseKind.QUEUE, "mail", now=T0)
    await store.register_worker(WorkerInfo("w1", "host", 1, ("default",), 4, tasks=("job",)))
    await store.sync_schedules(ScheduleSync([SCHEDULE], tasks=["job"], now=T0))
    held = await own_keys(raw, store.prefix)
    assert len(held) > 20
    assert {key_slot(key.encode()) for key in held} == {key_slot(f"{{{store.prefix}}}".encode())}
    stray = [k async for k in raw.scan_iter(match=f"*{store.prefix}*") if k not in held]
    assert stray == []


async def test_a_task_moved_twice_in_one_script_is_indexed_in_its_last_state_only(
    store: RedisBackend, raw: aioredis.Redis
) -> None:
    """A claim and a finish write the per-state indexes once, at their end:
    a child woken by a send (waiting, then pending) and cancelled by its
    parent's end (then cancelled) in one finish is in the cancelled index
    alone, as its hash says."""
    [parent] = await enqueue(store, coroutine())
    parent_claim = await claim(store, names=("coro",), limit=1)
    [child] = await enqueue(store, replace(coroutine(), parent_id=parent))
    [child_claim] = await claim(store, "w2", names=("coro",), limit=1)
    await store.finish(FinishParams("w2", [rest(child_claim, {})], now=T0))
    [sender] = await enqueue(store, coroutine())
    [sender_claim] = await claim(store, names=("coro",), limit=1)
    poll = rest(sender_claim, {}, sends=(Delivery(child, codec.encode("wake")),))
    cancelled = Completion(parent_claim[0].token, Outcome.CANCELLED, TaskState.CANCELLED)
    done = await store.finish(FinishParams("w1", [poll, cancelled], now=later(1)))
    assert done.applied == {sender_claim.token, parent_claim[0].token}
    found = await store.get_task(child)
    assert found is not None and found.state is TaskState.CANCELLED
    indexed = {
        state.value: await raw.zrange(keys.state(store.prefix, state.value), 0, -1)
        for state in TaskState
    }
    assert [s for s, ids in indexed.items() if str(child) in ids] == ["cancelled"]
    assert [s for s, ids in indexed.items() if str(parent) in ids] == ["cancelled"]
    assert [t.id for t in await store.list_tasks(TaskFilter(state=TaskState.WAITING))] == [sender]


@pytest.mark.parametrize(
    "text", ['quote " and backslash \\', "line\nbreak\ttab \u2603 \U0001f600", "</script> \x01", ""]
)
async def test_an_attempt_row_holds_any_text_of_its_error_and_worker(
    store: RedisBackend, text: str
) -> None:
    """The script writes an attempt's row as JSON text by hand: every string
    in it (worker id, error type, message, traceback) reads back as given."""
    [task_id] = await enqueue(store, new())
    worker = f"w {text}"
    [claimed] = await claim(store, worker)
    error = ErrorInfo(type=f"E{text}", message=text, traceback=text + "\n" + text)
    failed = Completion(claimed.token, Outcome.FAILED, TaskState.FAILED, error=error)
    assert (await store.finish(FinishParams(worker, [failed], now=T0))).applied == {claimed.token}
    found = await store.get_task(task_id)
    assert found is not None
    [attempt] = found.attempts
    assert (attempt.worker_id, attempt.error_type, attempt.error_message, attempt.traceback) == (
        worker,
        error.type,
        error.message,
        error.traceback,
    )
    assert (attempt.number, attempt.started_at, attempt.finished_at) == (1, T0, T0)


async def test_a_keyed_task_s_limit_that_does_not_read_never_reaches_its_key(
    store: RedisBackend, raw: aioredis.Redis
) -> None:
    """A keyed task whose limit was written around conveyor while it ran, and
    that is retried: its limit counts as none given, so the key (its row's
    room read from it) keeps handing out tasks, and the claim that meets the
    task sets it aside."""
    [task_id] = await enqueue(store, keyed("k", limit=2))
    [claimed] = await claim(store)
    await raw.hset(keys.task(store.prefix, task_id), "concurrency_limit", "nan")
    retry = Completion(claimed.token, Outcome.FAILED, TaskState.PENDING, retry_delay=0)
    done = await store.finish(FinishParams("w1", [retry], now=T0))
    assert done.applied == {claimed.token}
    assert await raw.hget(keys.concurrency(store.prefix, "k"), "max_running") != "nan"
    more = await enqueue(store, keyed("k", limit=2), keyed("k", limit=2))
    found = await claim(store, at=later(1))
    assert sorted(c.token.task_id for c in found) == more
    task = await store.get_task(task_id)
    assert task is not None and task.state is TaskState.FAILED
    assert task.attempts[-1].error_type == "CorruptTask"


async def test_a_lease_of_a_task_the_store_forgot_never_fences_its_successor(
    store: RedisBackend,
) -> None:
    """The store loses its keys (a restart without persistence) while task 1
    runs; a new task is task 1 again, claimed by the same worker as attempt
    1. The old token matches it in id, attempt and worker, but not in its
    claim's nonce: its heartbeat finds the lease lost and its completion is
    refused, while the new token's are applied."""
    [task_id] = await enqueue(store, new())
    [old] = await claim(store)
    await store.destroy()  # every key of the store: its id counter too
    assert await enqueue(store, new()) == [task_id]
    [current] = await claim(store)
    assert (current.token.task_id, current.token.attempt, current.token.worker_id) == (
        old.token.task_id,
        old.token.attempt,
        old.token.worker_id,
    )
    assert current.token.nonce != old.token.nonce
    beat = await store.heartbeat(
        HeartbeatParams("w1", [old.token, current.token], LEASE, now=later(1))
    )
    assert (beat.lost, beat.renewed) == ({old.token}, {current.token})
    assert await store.cancel(task_id) is TaskState.IN_PROGRESS
    assert await store.cancel_requested("w1", [old.token, current.token]) == {current.token}
    done = await store.finish(FinishParams("w1", [success(old.token, "old")], now=later(2)))
    assert done.rejected == {old.token}
    done = await store.finish(FinishParams("w1", [success(current.token, "new")], now=later(2)))
    assert done.applied == {current.token}
    task = await store.get_task(task_id)
    assert task is not None and task.state is TaskState.SUCCEEDED
    assert task.result == "new"
