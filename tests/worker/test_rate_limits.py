"""Rate limits with real workers, on every backend: starts of a rated task
stay within its bucket in any window, and the rate and a concurrency limit
share one key."""

from __future__ import annotations

import pytest

import conveyor
from conveyor import Concurrency, RateLimit, TaskState
from conveyor.errors import ConfigurationError
from tests.worker.helpers import RunningWorker, wait_terminal


@pytest.fixture
def app(any_app: conveyor.App) -> conveyor.App:
    return any_app


async def test_starts_stay_within_the_bucket(app: conveyor.App) -> None:
    @app.task(rate=RateLimit(limit=4, per=1))
    async def ping(n: int) -> None:
        return None

    async with app:
        handles = [await ping.enqueue_async(n=n) for n in range(12)]
        async with RunningWorker(app, concurrency=8), RunningWorker(app, concurrency=8):
            tasks = await wait_terminal(app, [h.id for h in handles], timeout=60)
    assert {t.state for t in tasks} == {TaskState.SUCCEEDED}
    # When the store started each attempt (its clock, which the bucket
    # reads): a handler's own start may lag its claim on a loaded machine.
    starts = sorted(t.attempts[0].started_at.timestamp() for t in tasks)
    # A full bucket of 4 at once, then 4 a second: never more than twice the
    # limit within any second, and 12 starts take at least 2 seconds.
    for first in starts:
        assert sum(1 for s in starts if first <= s < first + 1.0) <= 8
    assert starts[-1] - starts[0] >= 1.5


def test_a_rate_and_a_concurrency_share_one_key(app: conveyor.App) -> None:
    @app.task(concurrency=Concurrency(key="a"), rate=RateLimit(limit=1, per=1, key="b"))
    def clash() -> None:
        return None

    with pytest.raises(ConfigurationError, match="one flow-control key"):
        clash.enqueue()

    @app.task(concurrency=Concurrency(key="a"), rate=RateLimit(limit=1, per=1))
    def shared() -> None:
        return None

    assert app.get(shared.enqueue().id) is not None


@pytest.mark.parametrize(
    "bad", [{"limit": 0, "per": 1}, {"limit": 1, "per": 0}, {"limit": 1, "per": 1, "key": ""}]
)
def test_a_bad_rate_limit_is_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ConfigurationError, match="RateLimit"):
        RateLimit(**bad)  # type: ignore[arg-type]
