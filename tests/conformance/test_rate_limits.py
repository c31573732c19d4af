"""Rate limits on every backend: a key starts at most its bucket's tokens,
refilled at its rate, whoever claims; other keys and plain tasks go on."""

from __future__ import annotations

from dataclasses import replace

from conveyor.backends.params import FinishParams, NewTask
from conveyor.backends.protocol import Backend
from tests.conformance.test_tasks import claim, enqueue, later, new, success


def rated(key: str = "task:job", limit: int = 2, per: float = 10, **fields: object) -> NewTask:
    return replace(new(**fields), concurrency_key=key, rate_limit=limit, rate_period=per)  # type: ignore[arg-type]


async def test_a_key_starts_at_most_its_tokens_then_its_rate(backend: Backend) -> None:
    ids = await enqueue(backend, *(rated() for _ in range(6)))
    [plain] = await enqueue(backend, new())
    first = await claim(backend, limit=10, at=later(1))
    assert sorted(c.token.task_id for c in first) == sorted([*ids[:2], plain])
    assert await claim(backend, limit=10, at=later(2)) == []  # no token left
    await backend.finish(
        FinishParams(worker_id="w1", completions=[success(c.token) for c in first], now=later(3))
    )
    assert await claim(backend, limit=10, at=later(5)) == []  # finishing gives no token back
    third = await claim(backend, limit=10, at=later(6))
    assert [c.token.task_id for c in third] == [ids[2]]
    assert await claim(backend, limit=10, at=later(7)) == []
    fourth = await claim(backend, limit=10, at=later(11))
    assert [c.token.task_id for c in fourth] == [ids[3]]
    await backend.finish(
        FinishParams(
            worker_id="w1", completions=[success(c.token) for c in third + fourth], now=later(12)
        )
    )
    # A long pause refills the bucket to its size, no more.
    taken = await claim(backend, limit=10, at=later(100))
    assert [c.token.task_id for c in taken] == ids[4:6]


async def test_rates_are_per_key(backend: Backend) -> None:
    a = await enqueue(backend, *(rated("a", limit=1) for _ in range(3)))
    b = await enqueue(backend, *(rated("b", limit=1) for _ in range(3)))
    taken = await claim(backend, limit=10, at=later(1))
    assert sorted(c.token.task_id for c in taken) == [a[0], b[0]]


async def test_a_rate_and_a_concurrency_limit_on_one_key(backend: Backend) -> None:
    ids = await enqueue(
        backend, *(replace(rated("k", limit=5), concurrency_limit=1) for _ in range(3))
    )
    [one] = await claim(backend, limit=10, at=later(1))
    assert one.token.task_id == ids[0]  # five tokens, but one slot
    await backend.finish(
        FinishParams(worker_id="w1", completions=[success(one.token)], now=later(2))
    )
    assert [c.token.task_id for c in await claim(backend, limit=10, at=later(2))] == [ids[1]]


async def test_keys_list_what_holds_keyed_tasks_back_and_until_when(backend: Backend) -> None:
    await enqueue(backend, *(rated("r", limit=2, per=10) for _ in range(3)))
    keyed = replace(new(), concurrency_key="c", concurrency_limit=1)
    await enqueue(backend, keyed, keyed)
    before = {k.key: k for k in await backend.list_keys(now=later(0))}
    assert (before["c"].running, before["c"].pending, before["c"].max_running) == (0, 2, 1)
    assert (before["r"].pending, before["r"].rate_limit, before["r"].tokens) == (3, 2, 2)
    assert before["r"].next_start_at is None  # a token is there
    await claim(backend, limit=10, at=later(1))
    after = {k.key: k for k in await backend.list_keys(now=later(1))}
    assert (after["c"].running, after["c"].pending) == (1, 1)
    assert (after["r"].running, after["r"].pending, after["r"].tokens) == (2, 1, 0)
    assert after["r"].next_start_at == later(6)  # one token in 10 s / 2
