"""PostgreSQL: an enqueue that changes a key's limit (none of the key's
tasks pending) never waits for another doing the same. Two enqueues that
changed two keys' limits in opposite orders would otherwise deadlock; the
second skips a key row another writer holds, and the limit of the one that
changed it stays."""

from __future__ import annotations

import psycopg

from conveyor.backends.params import EnqueueParams
from conveyor.backends.postgres import PostgresBackend
from tests.conformance.test_concurrency_keys import keyed
from tests.conformance.test_tasks import T0, claim, enqueue, later
from tests.conftest import PG_URL


async def test_two_enqueues_changing_two_keys_limits_never_wait_for_each_other(
    backend: PostgresBackend,
) -> None:
    await enqueue(backend, keyed("a", limit=1), keyed("b", limit=1))
    assert len(await claim(backend, limit=10)) == 2  # rows stay, no task pending
    with psycopg.connect(PG_URL) as one, psycopg.connect(PG_URL) as two:
        two.execute("set lock_timeout to '5s'")
        backend.enqueue_in_sync(EnqueueParams([keyed("a", 2), keyed("b", 2)], now=T0), one)
        # Holds a and b changed, uncommitted: the second finds no task of
        # either pending (the first's are not visible) and would change both.
        backend.enqueue_in_sync(EnqueueParams([keyed("b", 3), keyed("a", 3)], now=T0), two)
        one.commit()
        two.commit()
    listed = {k.key: k for k in await backend.list_keys(now=later(1))}
    assert {key: (k.max_running, k.pending) for key, k in listed.items()} == {
        "a": (2, 2),
        "b": (2, 2),
    }
