"""Summaries through the App, on every backend, from tasks a real worker ran:
what ``list_tasks`` lists, without payloads, with each failure's last error."""

from __future__ import annotations

import pytest

import conveyor
from conveyor import RetryPolicy, TaskState
from conveyor.errors import ConfigurationError
from conveyor.model import Outcome
from tests.worker.helpers import run_all


@pytest.fixture
def app(any_app: conveyor.App) -> conveyor.App:
    return any_app


async def test_summaries_list_what_list_tasks_lists_with_the_last_error(
    app: conveyor.App,
) -> None:
    @app.task(retry=RetryPolicy(max_attempts=1))
    async def flaky(blob: str, fail: bool) -> int:
        if fail:
            raise ValueError("<bad> card " + "!" * 1000)
        return len(blob)

    async with app:
        handles = [await flaky.enqueue_async(blob="x" * 100_000, fail=n % 2 == 0) for n in range(4)]
        await run_all(app, handles)
        waiting = await flaky.enqueue_async(blob="y", fail=False)
        listed = await app.list_tasks_async()
        summaries = await app.list_summaries_async()
        assert (
            [s.id for s in summaries]
            == [t.id for t in listed]
            == [
                waiting.id,
                *(h.id for h in reversed(handles)),
            ]
        )
        failed = await app.list_summaries_async(state="failed", name=flaky.name, limit=10)
        assert [s.id for s in failed] == [handles[2].id, handles[0].id]
        for summary in failed:
            assert summary.state is TaskState.FAILED and summary.attempt == 1
            assert summary.last_error is not None
            assert summary.last_error.outcome is Outcome.FAILED
            assert summary.last_error.error_type == "ValueError"
            message = summary.last_error.error_message or ""
            assert message.startswith("<bad> card !") and len(message) == 500
        assert [s.last_error for s in summaries if s.state is TaskState.SUCCEEDED] == [None, None]
        page = await app.list_summaries_async(before=handles[2].id, limit=1)
        assert [s.id for s in page] == [handles[1].id]
    assert [s.id for s in app.list_summaries(state="pending")] == [waiting.id]
    with pytest.raises(ConfigurationError):
        app.list_summaries(limit=-1)
    with pytest.raises(ValueError, match="nonsense"):
        app.list_summaries(state="nonsense")
