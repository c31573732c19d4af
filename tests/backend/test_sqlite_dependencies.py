"""Dependencies on SQLite beyond the conformance suite: a long chain of
dependents ended by their policies in the one write that ends its head
(the trigger of migration 0016 finds them all at once, so a chain takes no
deeper trigger recursion than SQLite allows), and a bulk cancel that
selects a dependent its own cancel of a dependency ended first leaves it
as its policy ended it, as the memory store does."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest

from conveyor.backends.params import EnqueueParams, NewTask, earlier
from conveyor.backends.sqlite.backend import SQLiteBackend
from conveyor.model import TaskState
from conveyor.records import CancelMany
from tests.conformance.test_tasks import T0, later, new

S = TaskState

CHAIN = 3000
"""Longer than SQLite's 1000 levels of trigger recursion."""


@pytest.fixture
async def backend(tmp_path: Path) -> AsyncIterator[SQLiteBackend]:
    instance = SQLiteBackend(str(tmp_path / "conveyor.db"))
    await instance.open()
    yield instance
    await instance.close()


def after(*dependencies: int, policy: str) -> NewTask:
    return replace(new(), after=dependencies, after_policy=policy)


async def test_a_long_chain_of_ends_by_policy_is_one_write(backend: SQLiteBackend) -> None:
    policies = ["cancel", "fail"]
    chain = [new()] + [after(earlier(i), policy=policies[i % 2]) for i in range(CHAIN)]
    chain.append(after(earlier(CHAIN), policy="run"))
    ids = await backend.enqueue(EnqueueParams(tasks=chain, now=T0))
    assert await backend.cancel(ids[0], now=later(1)) is S.CANCELLED
    ends = [await backend.get_task(i, with_attempts=False) for i in (ids[1], ids[2], ids[-2])]
    assert [(t.state, t.finished_at) for t in ends if t is not None] == [
        (S.CANCELLED, later(1)),
        (S.FAILED, later(1)),
        (S.FAILED if CHAIN % 2 == 0 else S.CANCELLED, later(1)),
    ]
    runs = await backend.get_task(ids[-1], with_attempts=False)
    assert runs is not None and (runs.state, runs.waiting_for) == (S.PENDING, 0)
    for task_id in ids[1:]:
        assert [r.settled for r in await backend.dependencies(task_id)] == [True]


async def test_a_bulk_cancel_leaves_a_dependent_its_policy_ended(
    backend: SQLiteBackend,
) -> None:
    [a] = await backend.enqueue(EnqueueParams(tasks=[new()], now=T0))
    [d] = await backend.enqueue(EnqueueParams(tasks=[after(a, policy="fail")], now=T0))
    selection = CancelMany(ids=[a, d], states=(S.PENDING, S.WAITING), now=later(1))
    assert await backend.cancel_many(selection) == [a, d]
    task = await backend.get_task(d, with_attempts=False)
    assert task is not None and (task.state, task.finished_at) == (S.FAILED, later(1))
