"""Query-plan guards: the hot statements stay on their indexes as history grows.

100k finished tasks sit in the table, each with its attempt; the claim must
reach due work through the partial indexes, and heartbeat/finish through the
primary keys, never by scanning the table.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from conveyor import Retention
from conveyor.backends.params import ClaimParams, Completion, EnqueueParams
from conveyor.backends.postgres import PostgresBackend
from conveyor.backends.postgres.maintenance import _prune_args as prune_args
from conveyor.backends.postgres.reads import IN_INDEX_ORDER, ORDERED_STATEMENTS
from conveyor.backends.postgres.reads import _summaries_statement as summaries_statement
from conveyor.backends.postgres.rows import finish_statement
from conveyor.model import LeaseToken, Outcome, TaskState
from conveyor.records import TaskFilter
from tests.conformance.test_tasks import claim, enqueue, later, new

FINISHED = 100_000
BACKLOG = 100_000


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    found = [plan]
    for child in plan.get("Plans", []):
        found.extend(_nodes(child))
    return found


async def _plan(backend: PostgresBackend, name: str, args: dict[str, Any]) -> list[dict[str, Any]]:
    async with backend.pool.connection() as conn:
        cursor = await conn.execute(b"explain (format json) " + backend.sql[name], args)
        row = await cursor.fetchone()
    assert row is not None
    document = row[0] if not isinstance(row[0], str) else json.loads(row[0])
    return _nodes(document[0]["Plan"])


async def _fill(
    backend: PostgresBackend,
    finished: int,
    pending: int,
    finished_ago: str,
    state: str = "succeeded",
) -> None:
    """``finished`` tasks of ``state`` (made and finished ``finished_ago``,
    an SQL interval) and ``pending`` due ones, then a vacuum without analyze
    (as the workers run it where autovacuum is off)."""
    tasks = psycopg.sql.Identifier(backend.schema, "tasks")
    async with backend.pool.connection() as conn:
        await conn.execute(
            psycopg.sql.SQL(
                "insert into {} (name, queue, payload, state, max_attempts, retry_policy,"
                " attempt, spent, created_at, finished_at)"
                " select 'job', 'default', '{{}}', %s, 3, '{{}}', 1, 1,"
                " now() - %s::interval, now() - %s::interval from generate_series(1, %s)"
            ).format(tasks),
            (state, finished_ago, finished_ago, finished),
        )
        await conn.execute(
            psycopg.sql.SQL(
                "insert into {} (name, queue, payload, max_attempts, retry_policy)"
                " select 'job', 'default', '{{}}', 3, '{{}}' from generate_series(1, %s)"
            ).format(tasks),
            (pending,),
        )
        await conn.execute(psycopg.sql.SQL("vacuum {}").format(tasks))


async def _analyze(backend: PostgresBackend) -> None:
    """Statistics of the tasks table as it is now, as autovacuum takes them."""
    tasks = psycopg.sql.Identifier(backend.schema, "tasks")
    async with backend.pool.connection() as conn:
        await conn.execute(psycopg.sql.SQL("analyze {}").format(tasks))


@pytest.fixture
async def history(backend: PostgresBackend) -> PostgresBackend:
    await _fill(backend, FINISHED, 50, "0 seconds")
    tasks = psycopg.sql.Identifier(backend.schema, "tasks")
    async with backend.pool.connection() as conn:
        attempts = psycopg.sql.Identifier(backend.schema, "attempts")
        await conn.execute(
            psycopg.sql.SQL(
                "insert into {} (task_id, number, worker_id, outcome, finished_at)"
                " select id, 1, 'w', 'succeeded', now() from {} where state = 'succeeded'"
            ).format(attempts, tasks)
        )
        await conn.execute(psycopg.sql.SQL("analyze {}").format(tasks))
        await conn.execute(psycopg.sql.SQL("analyze {}").format(attempts))
    return backend


def _scanned_tables(nodes: list[dict[str, Any]]) -> set[str]:
    return {n.get("Relation Name", "") for n in nodes if n["Node Type"] == "Seq Scan"}


CLAIM_ARGS = {
    "now": None,
    "worker_id": "w",
    "names": ["job"],
    "queues": ["default"],
    "limit": 10,
    "lease": 30.0,
    "inbox_names": ["flow"],
}


@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
@pytest.mark.parametrize("name", ["claim", "claim_reclaim"])
async def test_claim_uses_the_partial_indexes(
    history: PostgresBackend, name: str, generic: bool
) -> None:
    nodes = await (
        _generic_plan(history, name, CLAIM_ARGS) if generic else _plan(history, name, CLAIM_ARGS)
    )
    assert not {"tasks", "attempts"} & _scanned_tables(nodes)
    indexes = {n.get("Index Name") for n in nodes}
    assert "tasks_pending_claim" in indexes
    if name == "claim_reclaim":
        # The reclaim path reads in-progress rows through one of the partial
        # or state indexes (the planner picks by their size), never the table.
        assert indexes & {"tasks_in_progress_lease", "tasks_state_id"}


@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
async def test_the_end_of_spent_leases_reads_only_running_tasks(
    history: PostgresBackend, generic: bool
) -> None:
    """It runs before every claim that takes back expired leases: it reads
    the in-progress rows through an index, never the backlog or the history."""
    nodes = await (
        _generic_plan(history, "end_expired", CLAIM_ARGS)
        if generic
        else _plan(history, "end_expired", CLAIM_ARGS)
    )
    assert not {"tasks", "attempts"} & _scanned_tables(nodes)
    indexes = {n.get("Index Name") for n in nodes}
    assert indexes & {"tasks_in_progress_lease", "tasks_state_id"}


async def test_claims_are_planned_once_per_connection(backend: PostgresBackend) -> None:
    """PostgreSQL's own choice re-planned the claim at every execution (its
    generic plan looks costlier than one for a known limit and one queue),
    and planning cost more than running it. The claim pool's connections
    keep one generic plan: the one the guards here check."""
    await enqueue(backend, *(new() for _ in range(4)))
    backend._sweep.interval = 3600  # sweeps only when told to, below
    for sweep in (True, False, True, False):
        if sweep:
            backend._sweep.missed()
        params = ClaimParams("w", ("job",), ("default",), limit=1, lease=30.0, now=later(1))
        assert len(await backend.claim(params)) == 1
    pool = await backend.claim_pool()
    async with pool.connection() as conn:
        cursor = await conn.execute(
            "select generic_plans, custom_plans from pg_prepared_statements"
            " where statement like '%%claimed as%%'"
            " and statement not like '%%pg_prepared_statements%%'"
        )
        plans = await cursor.fetchall()
    # Both statements ran twice on the one connection, on their generic plans.
    assert sorted(plans) == [(2, 0), (2, 0)]


async def test_heartbeat_and_finish_use_primary_keys(history: PostgresBackend) -> None:
    common = {"now": None, "worker_id": "w", "ids": [1, 2], "attempts": [1, 1]}
    beat = await _plan(history, "heartbeat", {**common, "lease": 30.0})
    assert "tasks" not in _scanned_tables(beat)
    assert "tasks_pkey" in {n.get("Index Name") for n in beat}
    completions = [
        Completion(LeaseToken(i, 1, "w"), Outcome.SUCCEEDED, TaskState.SUCCEEDED, result="1")
        for i in (1, 2)
    ]
    retry = Completion(LeaseToken(3, 1, "w"), Outcome.FAILED, TaskState.PENDING, retry_delay=1.0)
    for batch, statement in ((completions, "finish_succeeded"), ([*completions, retry], "finish")):
        name, args = finish_statement("w", batch, None)
        assert name == statement
        finish = await _plan(history, name, args)
        assert not {"tasks", "attempts"} & _scanned_tables(finish), name
        assert "tasks_pkey" in {n.get("Index Name") for n in finish}, name
    # The log's reader takes the logged attempts by key and the running one
    # by key or from the index of running tasks.
    log = await _plan(history, "get_attempts", {"id": 1})
    assert not {"tasks", "attempts"} & _scanned_tables(log)
    assert "attempts_pkey" in {n.get("Index Name") for n in log}


async def test_a_poll_s_ending_and_a_send_use_primary_keys(history: PostgresBackend) -> None:
    """The statements of a coroutine poll's completion and of a send reach their
    rows by id (an OR with a subquery once made the lock scan every row)."""
    ids = {"ids": [1, 2, 3], "own": [1, 2], "now": None}
    deliver = {
        "now": None,
        "channel": "conveyor_x",
        "task_ids": [1, 2],
        "sender_ids": [3, 3],
        "bodies": ["1", "2"],
        "traces": [None, None],
    }
    for name, args in (
        ("lock_tasks", ids),
        ("recipients", {"ids": [1, 2]}),
        ("deliver", deliver),
        ("rewake", {"ids": [1, 2], "channel": "conveyor_x", "now": None}),
    ):
        plan = await _plan(history, name, args)
        assert "tasks" not in _scanned_tables(plan), name
        assert "tasks_pkey" in {n.get("Index Name") for n in plan}, name
        # Every read of the tasks table is bounded by an index condition, not
        # a walk of a whole index with a filter.
        reads = [n for n in plan if n.get("Relation Name") == "tasks" and "Scan" in n["Node Type"]]
        assert all("Index Cond" in n for n in reads), (name, reads)


async def _generic_plan(
    backend: PostgresBackend, name: str, args: dict[str, Any], grow: int = 0, setting: str = ""
) -> list[dict[str, Any]]:
    """EXPLAIN ANALYZE of ``name`` as a prepared statement under its generic
    plan, the one a pooled connection settles on after a few executions: it
    knows nothing of the arrays it gets (it guesses 10 elements). Every
    parameter of the statement must carry a cast. ``grow``: the plan is made
    (by a first execution) on the table as it is, then ``grow`` tasks come
    before the plan is explained, inserted without a vacuum or an analyze
    (either would make the server plan the statement again). ``setting``: a
    planner setting the statement runs with (``set local ...``)."""
    sql = backend.sql[name].decode()
    names: list[str] = []
    types: list[str] = []
    for found in re.finditer(r"%\((\w+)\)s(::[\w\[\]]+)?", sql):
        if found.group(2) is None:
            raise AssertionError(f"{name}: every parameter needs a cast ({found.group(1)})")
        if found.group(1) not in names:
            names += [found.group(1)]
            types += [found.group(2)[2:]]
    numbered = re.sub(r"%\((\w+)\)s", lambda m: f"${names.index(m.group(1)) + 1}", sql)
    async with backend.pool.connection() as conn:
        await conn.execute("set plan_cache_mode = force_generic_plan")
        if setting:
            await conn.execute("begin")
            await conn.execute(setting)  # type: ignore[arg-type]
        try:
            # PREPARE and EXPLAIN EXECUTE take no bound parameters: sent as text.
            conn.pgconn.exec_(f"prepare probe ({', '.join(types)}) as {numbered}".encode())
            cursor = psycopg.AsyncClientCursor(conn)
            values = ", ".join(f"%s::{t}" for t in types)
            if grow:
                await cursor.execute(
                    f"execute probe ({values})",  # type: ignore[arg-type]
                    [args[n] for n in names],
                )
                await conn.execute(
                    psycopg.sql.SQL(
                        "insert into {} (name, queue, payload, max_attempts, retry_policy)"
                        " select 'job', 'default', '{{}}', 3, '{{}}' from generate_series(1, %s)"
                    ).format(psycopg.sql.Identifier(backend.schema, "tasks")),
                    (grow,),
                )
            await cursor.execute(
                f"explain (analyze, format json) execute probe ({values})",  # type: ignore[arg-type]
                [args[n] for n in names],
            )
            row = await cursor.fetchone()
        finally:
            # Before the rollback: psycopg answers a ROLLBACK on a connection
            # holding statements it prepared itself with DEALLOCATE ALL.
            await conn.execute("deallocate probe")
            if setting:
                await conn.execute("rollback")
            await conn.execute("reset plan_cache_mode")
    assert row is not None
    document = row[0] if not isinstance(row[0], str) else json.loads(row[0])
    return _nodes(document[0]["Plan"])


@pytest.mark.parametrize("plain", [True, False], ids=["finish_succeeded", "finish"])
async def test_finish_stays_linear_in_its_batch_under_a_generic_plan(
    history: PostgresBackend, plain: bool
) -> None:
    """A generic plan guesses 10 input rows: any join of the input with
    itself or with the updated rows becomes a nested loop, quadratic in the
    batch (300 completions: 90,000 row comparisons). Every join here must find
    its rows through keys or hashes, never by filtering a cross product."""
    backend = history
    batch = 300
    await enqueue(backend, *(new() for _ in range(batch)))
    claimed = await claim(backend, limit=batch)
    assert len(claimed) == batch
    completions = [
        Completion(c.token, Outcome.SUCCEEDED, TaskState.SUCCEEDED, result="null") for c in claimed
    ]
    if not plain:  # one retry among them: the general statement
        completions[0] = Completion(
            claimed[0].token, Outcome.FAILED, TaskState.PENDING, retry_delay=1.0
        )
    name, args = finish_statement("w1", completions, later(1))
    assert name == ("finish_succeeded" if plain else "finish")
    nodes = await _generic_plan(backend, name, args)
    removed = [n.get("Rows Removed by Join Filter", 0) for n in nodes]
    assert max(removed) < batch, removed
    updated = [n for n in nodes if n["Node Type"] == "ModifyTable"]
    # Every completion was applied (the tasks update returns them; the attempts
    # insert, of the one that failed, returns nothing), so the plan ran on the
    # whole batch. Plain successes insert no attempt row at all.
    assert [n["Actual Rows"] for n in updated] == ([batch] if plain else [batch, 0])


@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
@pytest.mark.parametrize("name", ["claim", "claim_reclaim"])
async def test_a_claim_reads_only_what_it_takes_from_a_fresh_backlog(
    backend: PostgresBackend, name: str, generic: bool
) -> None:
    """A bulk enqueue leaves the table without statistics until autovacuum
    analyzes it (a minute or more). The planner then guesses a handful of
    due rows, and once chose to read and sort the whole backlog for every
    claim (92 ms per claim of 100 tasks from 100k). The claim must read
    its rows in claim order from the index and stop at its limit, however
    little the planner knows."""
    for _ in range(BACKLOG // 5_000):  # as enqueue_many sends them
        await backend.enqueue(
            EnqueueParams(tasks=[new(run_at=None) for _ in range(5_000)], now=None)
        )
    args = {**CLAIM_ARGS, "limit": 100}
    nodes = await (
        _generic_plan(backend, name, args) if generic else _analyzed(backend, name, args)
    )
    # No trigger runs per claimed task (the attempt log's foreign key once
    # did: a lookup and a row lock each).
    assert not [n for n in nodes if n.get("Triggers")]
    scans = [n for n in nodes if n.get("Index Name") == "tasks_pending_claim"]
    assert scans and all(n["Actual Rows"] <= 100 for n in scans), scans
    assert not [n for n in nodes if n["Node Type"] == "Sort" and n["Actual Rows"] > 100]


async def _analyzed(
    backend: PostgresBackend, name: str, args: dict[str, Any], setting: str = ""
) -> list[dict[str, Any]]:
    async with backend.pool.connection() as conn:
        if setting:
            await conn.execute("begin")
            await conn.execute(setting)  # type: ignore[arg-type]
        cursor = await conn.execute(b"explain (analyze, format json) " + backend.sql[name], args)
        row = await cursor.fetchone()
        if setting:
            await conn.execute("rollback")
    assert row is not None
    document = row[0] if not isinstance(row[0], str) else json.loads(row[0])
    triggers = {"Node Type": "Triggers", "Triggers": document[0].get("Triggers")}
    return [triggers, *_nodes(document[0]["Plan"])]


@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
async def test_the_quarantine_reads_only_its_own_small_index(
    history: PostgresBackend, generic: bool
) -> None:
    """It runs with every claim that looks for expired leases: it must not
    walk the backlog or the history to find the (nearly always no) tasks
    whose counters stand at the limit."""
    nodes = await (
        _generic_plan(history, "quarantine", CLAIM_ARGS)
        if generic
        else _plan(history, "quarantine", CLAIM_ARGS)
    )
    assert "tasks" not in _scanned_tables(nodes)
    reads = [n for n in nodes if n.get("Relation Name") == "tasks" and "Scan" in n["Node Type"]]
    assert reads and {n.get("Index Name") for n in reads} <= {"tasks_unclaimable", "tasks_pkey"}


@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
async def test_the_quarantine_reads_no_task_of_a_fresh_backlog(
    backend: PostgresBackend, generic: bool
) -> None:
    """Beside a backlog the planner has no statistics for (a bulk enqueue
    before autovacuum's analyze), the quarantine once read every pending
    task through the state index (30 ms for 150,000, once per poll
    interval per worker): the OR of its due and expired branches drew a
    bitmap OR over the listing and lease indexes. It must still find its
    candidates in tasks_unclaimable alone."""
    for _ in range(4):
        await backend.enqueue(
            EnqueueParams(tasks=[new(run_at=None) for _ in range(5_000)], now=None)
        )
    nodes = await (
        _generic_plan(backend, "quarantine", CLAIM_ARGS)
        if generic
        else _analyzed(backend, "quarantine", CLAIM_ARGS)
    )
    indexes = {n["Index Name"] for n in nodes if "Index Name" in n}
    assert "tasks_unclaimable" in indexes and indexes <= {"tasks_unclaimable", "tasks_pkey"}
    assert "tasks" not in _scanned_tables(nodes)
    reads = [n for n in nodes if n.get("Relation Name") == "tasks" and "Scan" in n["Node Type"]]
    assert all(n["Actual Rows"] == n.get("Rows Removed by Filter", 0) == 0 for n in reads), reads


async def test_idempotency_keys_and_cancel_checks_use_their_indexes(
    history: PostgresBackend,
) -> None:
    for name, args, index in (
        ("stored_keys", {"names": ["job"], "keys": ["k"], "now": None}, "tasks_idempotency"),
        ("sent_keys", {"task_ids": [1], "keys": ["k"]}, "message_keys_pkey"),
        ("cancel_requested", {"worker_id": "w", "ids": [1, 2], "attempts": [1, 1]}, "tasks_pkey"),
    ):
        plan = await _plan(history, name, args)
        assert not {"tasks", "message_keys"} & _scanned_tables(plan), name
        assert index in {n.get("Index Name") for n in plan}, name


@pytest.mark.parametrize("analyzed", [False, True], ids=["fresh", "analyzed"])
@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
async def test_a_keyed_claim_never_walks_the_tasks_behind_a_full_key(
    backend: PostgresBackend, generic: bool, analyzed: bool
) -> None:
    """100k tasks wait behind one hot key whose one slot is taken: a claim
    must find the cold key's task without reading the hot key's backlog
    (neither the plain claim, whose index leaves keyed tasks out, nor the
    keyed claim, which reads the hot key's room off its running tasks),
    whether or not the statistics know of that backlog."""
    hot = replace(new(run_at=None), concurrency_key="hot", concurrency_limit=1)
    for _ in range(BACKLOG // 5_000):
        await backend.enqueue(EnqueueParams(tasks=[hot] * 5_000, now=None))
    if analyzed:
        await _analyze(backend)
    [running] = await backend.claim(
        ClaimParams(worker_id="w", names=["job"], queues=["default"], limit=1, lease=30)
    )
    cold = replace(new(run_at=None), concurrency_key="cold", concurrency_limit=1)
    [cold_id] = await backend.enqueue(EnqueueParams(tasks=[cold], now=None))
    args = {**CLAIM_ARGS, "limit": 10, "keys": ["hot", "cold"]}
    nodes = await (
        _generic_plan(backend, "claim_keyed", args)
        if generic
        else _analyzed(backend, "claim_keyed", args)
    )
    keyed_reads = [n for n in nodes if n.get("Index Name") == "tasks_pending_keyed"]
    assert keyed_reads and all(n["Actual Rows"] <= 10 for n in keyed_reads), keyed_reads
    assert not [n for n in nodes if n.get("Actual Rows", 0) > 100], [
        (n["Node Type"], n.get("Index Name"), n.get("Actual Rows")) for n in nodes
    ]
    plain = await _analyzed(backend, "claim", CLAIM_ARGS)
    assert not [n for n in plain if n.get("Actual Rows", 0) > 100]
    # EXPLAIN ANALYZE ran the keyed claim: it took the cold task, and nothing
    # of the hot key beside the one running.
    stored = await backend.get_task(cold_id, with_attempts=False)
    assert stored is not None and stored.state is TaskState.IN_PROGRESS
    again = await backend.claim(
        ClaimParams(worker_id="w", names=["job"], queues=["default"], limit=10, lease=30)
    )
    assert again == [] and running.token.task_id != cold_id


def _prune_args(retention: Retention) -> dict[str, Any]:
    """The prune statement's arguments, as the backend builds them, for a
    batch of ``retention`` now (no workers)."""
    return prune_args(retention.params(datetime.now(UTC), workers=False))


@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
async def test_a_prune_batch_reads_only_what_it_deletes_without_statistics(
    backend: PostgresBackend, generic: bool
) -> None:
    """With autovacuum off nothing analyzes the tables, and the planner
    guesses that a state matches 0.5 % of the rows: the prune once read and
    sorted every finished task for every batch (80 ms for 1,000 of 150k),
    and fell behind a fast drain. A batch must walk its state's tasks in id
    order and stop at its limit, however little the planner knows."""
    await _fill(backend, 20_000, 5_000, "1 hour")
    nodes = await _prune_plan(backend, Retention(succeeded=60, batch=1000), generic)
    assert _deleted(nodes) == [1000]
    # The walk (t) and the look at each one's parent (p); the delete is a
    # join the planner may take either way on a table this small.
    walked = [n for n in nodes if n.get("Alias") in ("t", "p") and "Scan" in n["Node Type"]]
    assert walked and all(n["Actual Rows"] <= 1000 for n in walked), walked
    assert not [n for n in nodes if n["Node Type"] == "Sort" and n["Actual Rows"] > 1000]


async def _stale_statistics(backend: PostgresBackend, finished: int, pending: int) -> None:
    """``finished`` succeeded tasks an hour old, analyzed, then ``pending``
    due tasks the statistics do not know of: the table as a drain finds it
    between two runs of autovacuum, the statistics saying no task is alive."""
    await _fill(backend, finished, 0, "1 hour")
    await _analyze(backend)
    await _fill(backend, 0, pending, "1 hour")


async def _prune_plan(
    backend: PostgresBackend, retention: Retention, generic: bool
) -> list[dict[str, Any]]:
    """The prune's analyzed plan, custom or generic, for a batch of ``retention`` now."""
    args = _prune_args(retention)
    if generic:
        return await _generic_plan(backend, "prune", args)
    return await _analyzed(backend, "prune", args)


def _deleted(nodes: list[dict[str, Any]]) -> list[int]:
    """Rows each delete from tasks removed."""
    return [
        n["Actual Rows"]
        for n in nodes
        if n.get("Operation") == "Delete" and n["Relation Name"] == "tasks"
    ]


def _walk_reads(nodes: list[dict[str, Any]]) -> tuple[int, int]:
    """The prune's walk (alias t): how many scans, how many rows they read
    (kept and filtered out, over every loop)."""
    walked = [n for n in nodes if n.get("Alias") == "t" and "Scan" in n["Node Type"]]
    read = sum(
        (n["Actual Rows"] + n.get("Rows Removed by Filter", 0)) * n["Actual Loops"] for n in walked
    )
    return len(walked), read


def _parent_looks(nodes: list[dict[str, Any]]) -> int:
    """Rows read to learn whether each candidate's parent is alive: every
    row of every scan of ``p``, and what a join threw away."""

    def of_p(node: dict[str, Any]) -> bool:
        return node.get("Alias") == "p" and "Scan" in node["Node Type"]

    def inputs(node: dict[str, Any]) -> list[dict[str, Any]]:
        """A join's inputs, through what keeps or hashes one."""
        found = []
        for child in node.get("Plans", []):
            kept = child["Node Type"] in ("Materialize", "Hash", "Memoize")
            found += inputs(child) if kept else [child]
        return found

    read = sum(n["Actual Rows"] * n["Actual Loops"] for n in nodes if of_p(n))
    joins = [n for n in nodes if any(of_p(child) for child in inputs(n))]
    return read + sum(n.get("Rows Removed by Join Filter", 0) for n in joins)


@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
async def test_a_prune_batch_never_reads_the_live_tasks_statistics_do_not_know_of(
    backend: PostgresBackend, generic: bool
) -> None:
    """Statistics taken when every task had finished said no task was
    alive; then a backlog came. The look at each candidate's parent became a
    scan of every live task, kept and read again for each candidate: a
    batch of 1,000 took 40 s against a backlog of a million, and the drain
    beside it slowed to a fifth. Each parent is one probe of the primary
    key, whatever the statistics say."""
    await _stale_statistics(backend, 5_000, 5_000)
    nodes = await _prune_plan(backend, Retention(succeeded=60, batch=1000), generic)
    assert _deleted(nodes) == [1000]
    assert "tasks" not in _scanned_tables([n for n in nodes if n.get("Alias") == "p"])
    assert _parent_looks(nodes) <= 1000


async def test_a_prune_s_dry_run_never_reads_the_live_tasks_for_a_parent(
    backend: PostgresBackend,
) -> None:
    """The dry run of a prune looks at parents the same way, under the same
    stale statistics."""
    await _stale_statistics(backend, 5_000, 5_000)
    counted = await _analyzed(backend, "count_prunable", _prune_args(Retention(succeeded=60)))
    assert "tasks" not in _scanned_tables([n for n in counted if n.get("Alias") == "p"])
    assert _parent_looks(counted) <= 5_000


@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
async def test_a_prune_with_nothing_to_delete_reads_no_task_it_keeps(
    backend: PostgresBackend, generic: bool
) -> None:
    """The last batch of every prune finds nothing left to delete. It used
    to walk every task of each state to learn that: a second per prune on a
    million tasks, and a day of history at 100M tasks a day is a hundred
    million. A task finishes after it is made, so the walk stops at the
    first task made after the cutoff, found by a search of the ids."""
    await _fill(backend, 5_000, 5_000, "1 hour")
    nodes = await _prune_plan(backend, Retention(succeeded=86_400, batch=1000), generic)
    assert _deleted(nodes) == [0]
    # The walk (t; the delete, a join the planner may take either way on a
    # table this small, has nothing to join) and the search (n).
    scans, read = _walk_reads(nodes)
    assert scans and read == 0, read
    assert "tasks" not in _scanned_tables([n for n in nodes if n.get("Alias") == "n"])
    # The search: about one probe of the primary key per halving of the ids.
    probes = [n for n in nodes if n.get("Alias") == "n" and "Scan" in n["Node Type"]]
    assert sum(n["Actual Loops"] for n in probes) <= 3 * 20


@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
async def test_a_prune_reads_no_task_of_a_state_kept_longer(
    backend: PostgresBackend, generic: bool
) -> None:
    """Failed and cancelled tasks are kept two weeks, succeeded ones a day:
    below the succeeded cutoff lie the failed tasks of thirteen days. At 1%
    failures of 100M tasks a day that is 13M rows, and the walk for
    succeeded tasks used to read them all, every prune (every minute), to
    delete nothing. Each state's walk reads only tasks of its state."""
    # Failed tasks made and finished two hours ago, then newer succeeded ones.
    await _fill(backend, 5_000, 0, "2 hours", state="failed")
    await _fill(backend, 1_000, 1_000, "30 minutes")
    nodes = await _prune_plan(backend, Retention(succeeded=3_600, batch=1000), generic)
    assert _deleted(nodes) == [0]
    scans, read = _walk_reads(nodes)
    assert scans and read == 0, read


async def test_the_dashboard_s_activity_read_is_bounded_by_the_state_index(
    history: PostgresBackend,
) -> None:
    """No index holds finish times: the activity read takes the newest tasks
    of each finished state off the state index, never the whole table."""
    args = {"since": datetime(2030, 1, 1, tzinfo=UTC), "bucket": 60, "scan": 1000}
    plan = await _plan(history, "activity", args)
    assert "tasks" not in _scanned_tables(plan)
    assert "tasks_state_id" in {n.get("Index Name") for n in plan}
    limits = [n["Plan Rows"] for n in plan if n.get("Node Type") == "Limit"]
    assert len(limits) == 2 and max(limits) == 1000  # one per state, the succeeded one full


@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
@pytest.mark.parametrize("name", ["claim", "claim_keyed"])
async def test_a_claim_reads_a_coroutine_s_inbox_through_its_index(
    history: PostgresBackend, name: str, generic: bool
) -> None:
    args = {
        **CLAIM_ARGS,
        "inbox_names": ["job"],
        **({"keys": ["k"]} if name == "claim_keyed" else {}),
    }
    nodes = await (_generic_plan(history, name, args) if generic else _plan(history, name, args))
    assert "messages" not in _scanned_tables(nodes)
    assert "messages_inbox" in {n.get("Index Name") for n in nodes}


async def test_no_statement_of_conveyor_s_connections_is_jit_compiled(
    history: PostgresBackend,
) -> None:
    """Past ``jit_above_cost`` the server compiled each claim's expressions
    at every execution: 0.3-0.6 s a claim once 2.5 million tasks were
    pending, where the claim itself ran in a few milliseconds. Each of
    conveyor's pools turns JIT off; with the server's threshold at zero (as
    every statement of a big enough table would cross it), a claim on the
    claims' own connection shows no JIT in its plan."""
    pools = [history.pool, await history.claim_pool()]
    for pool in pools:
        async with pool.connection() as conn:
            cursor = await conn.execute("show jit")
            assert await cursor.fetchone() == ("off",)
            cursor = await conn.execute("show enable_seqscan")
            assert await cursor.fetchone() == ("off",)
    with history.sync_pool.connection() as sync_conn:
        assert sync_conn.execute("show jit").fetchone() == ("off",)
        assert sync_conn.execute("show enable_seqscan").fetchone() == ("off",)
    async with pools[1].connection() as conn:
        await conn.execute("set jit_above_cost = 0")
        cursor = await conn.execute(
            b"explain (analyze, format json) " + history.sql["claim"], CLAIM_ARGS
        )
        row = await cursor.fetchone()
        await conn.execute("reset jit_above_cost")
    assert row is not None
    document = row[0] if not isinstance(row[0], str) else json.loads(row[0])
    assert "JIT" not in document[0], document[0]["JIT"]


async def test_a_handler_s_statements_are_planned_with_the_server_s_settings(
    backend: PostgresBackend,
) -> None:
    """conveyor's connections weigh no sequential scan, but a handler's own
    statements in its attempt transaction are planned as the server plans
    them for any client; conveyor's statements that end the transaction
    take the setting back, and the connection keeps it after."""
    await enqueue(backend, new())
    [task] = await claim(backend)
    transaction = await backend.begin_attempt_transaction("w1")
    cursor = await transaction.connection.execute("show enable_seqscan")
    assert await cursor.fetchone() == ("on",)
    done = Completion(task.token, Outcome.SUCCEEDED, TaskState.SUCCEEDED, result="null")
    assert await transaction.commit_success(done)
    sync = backend.begin_attempt_transaction_sync("w1")
    assert sync.connection.execute("show enable_seqscan").fetchone() == ("on",)
    await sync.rollback()
    # Every connection the pool holds, the transaction's among them.
    held = [await backend.pool.getconn() for _ in range(backend.pool.get_stats()["pool_size"])]
    assert transaction.connection in held
    try:
        for conn in held:
            cursor = await conn.execute("show enable_seqscan")
            assert await cursor.fetchone() == ("off",)
    finally:
        for conn in held:
            await backend.pool.putconn(conn)


async def _analyzed_backlog(backend: PostgresBackend, pending: int, running: int) -> list[int]:
    """``pending`` due tasks and ``running`` ones under live leases of
    worker ``w`` (attempt 1), all analyzed: the table as autovacuum (or a
    worker's own vacuum) leaves it in the middle of a big drain. Returns
    the running tasks' ids."""
    await _fill(backend, 0, pending + running, "1 hour")
    tasks = psycopg.sql.Identifier(backend.schema, "tasks")
    async with backend.pool.connection() as conn:
        cursor = await conn.execute(
            psycopg.sql.SQL(
                "update {} set state = 'in_progress', attempt = 1, spent = 1, worker_id = 'w',"
                " attempt_started_at = now(), lease_expires_at = now() + interval '1 hour'"
                " where id in (select id from {} order by id desc limit %s) returning id"
            ).format(tasks, tasks),
            (running,),
        )
        ids = sorted(row[0] for row in await cursor.fetchall())
        await conn.execute(psycopg.sql.SQL("vacuum analyze {}").format(tasks))
    return ids


def _rows_read_from_tasks(nodes: list[dict[str, Any]]) -> int:
    """The most rows any one scan of the tasks table read (kept and
    filtered out, over all its loops)."""
    return max(
        (
            (n["Actual Rows"] + n.get("Rows Removed by Filter", 0)) * n["Actual Loops"]
            for n in nodes
            if n.get("Relation Name") == "tasks" and "Scan" in n["Node Type"]
        ),
        default=0,
    )


@pytest.mark.parametrize(
    "name", ["claim", "claim_reclaim", "end_expired", "quarantine", "claim_keyed"]
)
async def test_a_claim_takes_its_rows_by_key_from_an_analyzed_backlog(
    backend: PostgresBackend, name: str
) -> None:
    """Once statistics know of a big backlog (autovacuum analyzed it, or a
    worker's own vacuum did), the generic plan of a claim guesses that its
    LIMIT keeps a tenth of the due tasks, and it once updated the claimed
    rows through a hash join over a scan of the whole table: 35 ms a claim
    of 200 beside 100,000 pending tasks, a drain three times slower than on
    the same table unanalyzed. Every row a claim writes is found by key."""
    await _analyzed_backlog(backend, 50_000, 5_000)
    args = {**CLAIM_ARGS, "limit": 100, "keys": ["k"]}
    nodes = await _generic_plan(backend, name, args)
    assert "tasks" not in _scanned_tables(nodes)
    assert _rows_read_from_tasks(nodes) <= 200, [
        (n["Node Type"], n.get("Index Name"), n["Actual Rows"], n["Actual Loops"])
        for n in nodes
        if n.get("Relation Name") == "tasks"
    ]


async def test_a_lease_s_statements_find_their_rows_by_key_beside_an_analyzed_backlog(
    backend: PostgresBackend,
) -> None:
    """The renewal, the cancel check and both finishes of 300 running tasks,
    beside 50,000 pending ones and the running ones themselves analyzed:
    every row is reached by key, however large the statistics say the
    backlog or the running set is."""
    running = await _analyzed_backlog(backend, 50_000, 5_000)
    ids = running[:300]
    common = {"now": None, "worker_id": "w", "ids": ids, "attempts": [1] * len(ids)}
    tokens = [LeaseToken(i, 1, "w") for i in ids]
    plain = [Completion(t, Outcome.SUCCEEDED, TaskState.SUCCEEDED, result="1") for t in tokens]
    retry = Completion(tokens[0], Outcome.FAILED, TaskState.PENDING, retry_delay=1.0)
    statements = [
        ("heartbeat", {**common, "lease": 30.0}),
        ("cancel_requested", {k: common[k] for k in ("worker_id", "ids", "attempts")}),
        finish_statement("w", [retry, *plain[1:150]], None),
        finish_statement("w", plain[150:], None),
    ]
    assert [name for name, _ in statements][2:] == ["finish", "finish_succeeded"]
    for name, args in statements:
        nodes = await _generic_plan(backend, name, args)
        assert "tasks" not in _scanned_tables(nodes), name
        assert _rows_read_from_tasks(nodes) <= 2 * len(ids), name


async def test_the_inbox_statements_find_their_rows_by_key_beside_an_analyzed_backlog(
    backend: PostgresBackend,
) -> None:
    """A send, a poll's ending and a replace of pending tasks, under their
    generic plans beside an analyzed backlog: every read of the tasks table
    is bounded by the ids it names."""
    running = await _analyzed_backlog(backend, 50_000, 5_000)
    ids, pending = running[:100], [running[0] - 1, running[0] - 2]
    n = len(ids)
    statements = [
        ("lock_tasks", {"ids": ids, "own": ids[:50], "now": None}),
        ("recipients", {"ids": ids}),
        ("guard_send", {"ids": ids}),
        ("guard_endings", {"ids": ids}),
        ("fence_check", {"ids": ids, "attempts": [1] * n, "worker_id": "w", "now": None}),
        (
            "deliver",
            {
                "now": None,
                "task_ids": ids,
                "sender_ids": ids[::-1],
                "bodies": ["1"] * n,
                "traces": [None] * n,
            },
        ),
        ("rewake", {"ids": ids, "now": None}),
        (
            "replace_pending",
            {
                "ids": pending,
                "payloads": ["{}", "{}"],
                "priorities": [0, 0],
                "run_ats": [None, None],
                "delays": [0.0, 0.0],
                "now": None,
            },
        ),
    ]
    for name, args in statements:
        nodes = await _generic_plan(backend, name, args)
        assert "tasks" not in _scanned_tables(nodes), name
        assert _rows_read_from_tasks(nodes) <= 2 * n, name


@pytest.mark.parametrize("statement", ["retry_many", "cancel_many", "delete_many"])
async def test_a_bulk_batch_takes_its_rows_by_key_beside_analyzed_failures(
    backend: PostgresBackend, statement: str
) -> None:
    """A bulk retry (cancel, delete) walks 100,000 tasks the statistics know
    of in batches of 1,000: each batch moves the rows it chose by key, never
    through a scan of the whole table (the generic plan guesses that its
    LIMIT passes a tenth of them)."""
    state = "pending" if statement == "cancel_many" else "failed"
    await _fill(backend, 100_000, 0, "1 hour", state=state)
    await _analyze(backend)
    args = {
        "states": [state],
        "ids": None,
        "after": 0,
        "name": None,
        "queue": None,
        "since": None,
        "until": None,
        "limit": 1000,
        "now": None,
    }
    nodes = await _generic_plan(backend, statement, args)
    assert "tasks" not in _scanned_tables(nodes)
    assert _rows_read_from_tasks(nodes) <= 2000


KEPT_IDS = list(range(1, 301))
KEPT_STATEMENTS: list[tuple[str, dict[str, Any]]] = [
    ("claim", {**CLAIM_ARGS, "limit": 100}),
    (
        "heartbeat",
        {"now": None, "worker_id": "w", "ids": KEPT_IDS, "attempts": [1] * 300, "lease": 30.0},
    ),
    ("cancel_requested", {"worker_id": "w", "ids": KEPT_IDS, "attempts": [1] * 300}),
    finish_statement(
        "w",
        [
            Completion(LeaseToken(i, 1, "w"), Outcome.SUCCEEDED, TaskState.SUCCEEDED, result="1")
            for i in KEPT_IDS
        ],
        None,
    ),
    ("get_task", {"id": 150}),
    ("recipients", {"ids": KEPT_IDS}),
    ("stored_keys", {"names": ["job"] * 3, "keys": ["a", "b", "c"], "now": None}),
]


@pytest.mark.parametrize(("name", "args"), KEPT_STATEMENTS, ids=[n for n, _ in KEPT_STATEMENTS])
async def test_a_plan_made_on_an_empty_table_still_finds_its_rows_by_key(
    backend: PostgresBackend, name: str, args: dict[str, Any]
) -> None:
    """A pooled connection keeps a statement's plan for its life. Made while
    the tasks table was empty, where scanning the table cost less than a
    look in an index, the plans of a claim, a renewal and a finish kept
    scanning every task once 100,000 came (a finish of 50,000 completions
    took 11 s), until an ANALYZE made the server plan them again. conveyor's
    connections weigh no sequential scan where an index serves."""
    nodes = await _generic_plan(backend, name, args, grow=20_000)
    assert "tasks" not in _scanned_tables(nodes), name


async def test_the_counts_of_every_task_weigh_a_sequential_scan(
    backend: PostgresBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A statement that reads every task has no index to take; forced to a
    sequential scan with scans switched off, the planner also gave up the
    rest of a good plan (the count by state sorted where it would hash: five
    times as long on 500,000 tasks). Those statements run with the server's
    setting, in a transaction of their own."""
    probe = {**backend.sql, "probe": b"show enable_seqscan"}
    monkeypatch.setattr(backend, "sql", probe)
    assert await backend._fetchall_scanning("probe", {}) == [("on",)]
    assert await backend._fetchall("probe", {}) == [("off",)]
    routed: list[str] = []
    scanning = backend._fetchall_scanning

    async def recorded(name: str, args: Any) -> list[tuple[Any, ...]]:
        routed.append(name)
        return await scanning(name, args)

    monkeypatch.setattr(backend, "_fetchall_scanning", recorded)
    await backend.count_tasks()
    await backend.count_prunable(Retention(succeeded=60).params(datetime.now(UTC), workers=False))
    assert routed == ["count_tasks", "count_prunable"]


SUMMARY_LIMIT = 50
SUMMARY_FILTERS: list[tuple[str, dict[str, Any], str]] = [
    # (statement, filter, the index its page is read from)
    ("list_summaries", {}, "tasks_pkey"),
    ("list_summaries", {"name": "job", "queue": "default", "before": 15_000}, "tasks_pkey"),
    ("list_summaries_in_state", {"state": "pending"}, "tasks_state_id"),
    ("list_summaries_in_state", {"state": "succeeded", "before": 15_000}, "tasks_state_id"),
    ("list_summaries_in_state", {"state": "failed", "name": "job"}, "tasks_state_id"),
    ("list_summaries_in_state", {"state": "failed", "queue": "default"}, "tasks_state_id"),
    ("list_running_summaries", {"state": "in_progress"}, "tasks_in_progress_lease"),
    ("list_running_summaries", {"state": "in_progress", "name": "job"}, "tasks_in_progress_lease"),
    ("list_child_summaries", {"parent": 1}, "tasks_parent"),
    ("list_child_summaries", {"parent": 1, "state": "pending", "before": 20_500}, "tasks_parent"),
]


@pytest.fixture
async def unanalyzed(backend: PostgresBackend) -> PostgresBackend:
    """20,000 succeeded tasks, 2,000 pending ones (200 of them children of
    task 1), 500 failed ones with their attempt, 100 running: a fresh schema
    never analyzed, as a server with autovacuum off keeps it."""
    await _fill(backend, 20_000, 2_600, "1 hour")
    tasks = psycopg.sql.Identifier(backend.schema, "tasks")
    attempts = psycopg.sql.Identifier(backend.schema, "attempts")
    statements = [
        "update {tasks} set state = 'failed', attempt = 1, finished_at = now()"
        " where id > 22000 and id <= 22500",
        "insert into {attempts} (task_id, number, worker_id, outcome, finished_at, error_type,"
        " error_message) select id, 1, 'w', 'failed', now(), 'E', repeat('m', 5000)"
        " from {tasks} where state = 'failed'",
        "update {tasks} set state = 'in_progress', attempt = 1, worker_id = 'w',"
        " lease_expires_at = now() + interval '1 hour' where id > 22500",
        "update {tasks} set parent_id = 1 where id > 20000 and id <= 20200",
    ]
    async with backend.pool.connection() as conn:
        for statement in statements:
            await conn.execute(
                psycopg.sql.SQL(statement).format(tasks=tasks, attempts=attempts)  # type: ignore[arg-type]
            )
        cursor = await conn.execute(
            "select count(*) from pg_stats where schemaname = %s", (backend.schema,)
        )
        assert await cursor.fetchone() == (0,)  # no statistics
    return backend


def _summary_args(given: dict[str, Any]) -> dict[str, Any]:
    args = {"state": None, "name": None, "queue": None, "before": None, "parent": None}
    return {**args, **given, "limit": SUMMARY_LIMIT, "error_chars": 500}


@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
@pytest.mark.parametrize(
    ("name", "given", "index"), SUMMARY_FILTERS, ids=[f"{n}-{g}" for n, g, _ in SUMMARY_FILTERS]
)
async def test_a_summarized_page_is_read_off_its_index_without_statistics(
    unanalyzed: PostgresBackend, name: str, given: dict[str, Any], index: str, generic: bool
) -> None:
    """The dashboard's lists, on a table the planner knows nothing of (no
    ANALYZE: autovacuum off): a listing of pending tasks once took 64-134 s,
    sorting wide rows. A summarized page takes its ids off the index that
    serves its filter (in index order, or the few running tasks' or one
    parent's children's ids sorted), and reads whole only the rows it shows."""
    state = TaskState(given["state"]) if "state" in given else None
    filtered = TaskFilter(state=state, parent=given.get("parent"))
    assert summaries_statement(filtered) == name
    args = _summary_args(given)
    setting = IN_INDEX_ORDER if name in ORDERED_STATEMENTS else ""
    nodes = await (
        _generic_plan(unanalyzed, name, args, setting=setting)
        if generic
        else _analyzed(unanalyzed, name, args, setting=setting)
    )
    assert "tasks" not in _scanned_tables(nodes)
    assert index in {n.get("Index Name") for n in nodes}
    sorted_rows = [n["Actual Rows"] for n in nodes if n["Node Type"] == "Sort"]
    if index in ("tasks_pkey", "tasks_state_id"):
        assert max(sorted_rows, default=0) <= SUMMARY_LIMIT  # only the page, if anything
    else:
        assert max(sorted_rows, default=0) <= 200  # the running ids, or the children's
    assert _rows_read_from_tasks(nodes) <= 200 + 2 * SUMMARY_LIMIT
    reads_attempts = [n for n in nodes if n.get("Relation Name") == "attempts"]
    assert all("Index" in n["Node Type"] for n in reads_attempts)


async def test_running_tasks_are_counted_by_worker_off_the_lease_index(
    unanalyzed: PostgresBackend,
) -> None:
    """The workers page counts each worker's running tasks, where it once
    listed a thousand of them whole: only the running rows are read."""
    nodes = await _analyzed(unanalyzed, "running_by_worker", {})
    assert "tasks" not in _scanned_tables(nodes)
    assert _rows_read_from_tasks(nodes) == 100
    assert await unanalyzed.running_by_worker() == {"w": 100}
