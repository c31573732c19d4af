"""Progress reports at the backend level, on every backend: a report is
stored on its task only under a live lease (this attempt, this worker, not
expired: the heartbeat's fence), with the store's clock; a later report
replaces it; it stays after the attempt ends and is replaced by a later
attempt's; it extends no lease; a stored report that does not read (written
around conveyor) hides nothing else of the task."""

from __future__ import annotations

from dataclasses import replace

import pytest

from conveyor.backends.params import FinishParams, HeartbeatParams, ProgressParams, ProgressReport
from conveyor.backends.protocol import Backend
from conveyor.backends.stored import progress_text
from conveyor.errors import ConfigurationError
from conveyor.model import LeaseToken, Progress, TaskState, check_progress
from tests.conformance.test_store_texts import set_in_redis, write_around
from tests.conformance.test_tasks import LEASE, T0, claim, enqueue, later, new, success


def report(token: LeaseToken, done: int, total: int | None = None, note: str | None = None):
    return ProgressReport(token, progress_text(done, total, note, token.attempt))


async def progress_of(backend: Backend, task_id: int) -> Progress | None:
    task = await backend.get_task(task_id, with_attempts=False)
    assert task is not None
    return task.progress


async def test_a_report_is_stored_under_a_live_lease_only(backend: Backend) -> None:
    await enqueue(backend, new(), new())
    first, second = await claim(backend)
    stranger = replace(second.token, worker_id="w2")
    stale = replace(second.token, attempt=second.token.attempt + 5)
    stored = await backend.report_progress(
        ProgressParams(
            "w1",
            [report(first.token, 3, 10, "resizing"), report(stale, 1)],
            now=later(1),
        )
    )
    assert stored == {first.token}
    assert (
        await backend.report_progress(ProgressParams("w2", [report(stranger, 2)], now=later(1)))
        == frozenset()
    )
    assert await progress_of(backend, first.token.task_id) == Progress(
        3, 10, "resizing", first.token.attempt, later(1)
    )
    assert await progress_of(backend, second.token.task_id) is None
    # A report extends no lease: past it, the report is refused.
    task = await backend.get_task(first.token.task_id)
    assert task is not None and task.lease_expires_at == later(LEASE)
    refused = await backend.report_progress(
        ProgressParams("w1", [report(first.token, 4, 10)], now=later(LEASE))
    )
    assert refused == frozenset()
    assert await progress_of(backend, first.token.task_id) == Progress(
        3, 10, "resizing", first.token.attempt, later(1)
    )


async def test_a_later_report_replaces_and_the_last_stays_after_the_end(backend: Backend) -> None:
    [task_id] = await enqueue(backend, new())
    [claimed] = await claim(backend)
    token = claimed.token
    for done, at in ((1, 1), (2, 2), (5, 3)):
        params = ProgressParams("w1", [report(token, done, 5, None)], now=later(at))
        assert await backend.report_progress(params) == {token}
    await backend.finish(FinishParams("w1", [success(token)], now=later(4)))
    task = await backend.get_task(task_id, with_attempts=False)
    assert task is not None and task.state is TaskState.SUCCEEDED
    assert task.progress == Progress(5, 5, None, token.attempt, later(3))
    assert task.progress.fraction == 1.0
    # Finished: the lease is gone, a late report is refused.
    late = ProgressParams("w1", [report(token, 1, 5)], now=later(5))
    assert await backend.report_progress(late) == frozenset()


async def test_a_later_attempt_replaces_an_earlier_attempts_report(backend: Backend) -> None:
    [task_id] = await enqueue(backend, new())
    [first] = await claim(backend)
    await backend.report_progress(ProgressParams("w1", [report(first.token, 7, 9)], now=later(1)))
    # The first worker vanishes; the task is reclaimed past its lease.
    [second] = await claim(backend, "w2", at=later(LEASE + 1))
    assert second.token.attempt == first.token.attempt + 1
    kept = await progress_of(backend, task_id)
    assert kept is not None and (kept.done, kept.attempt) == (7, first.token.attempt)
    stale = ProgressParams("w1", [report(first.token, 8, 9)], now=later(LEASE + 2))
    assert await backend.report_progress(stale) == frozenset()
    fresh = ProgressParams("w2", [report(second.token, 1)], now=later(LEASE + 2))
    assert await backend.report_progress(fresh) == {second.token}
    assert await progress_of(backend, task_id) == Progress(
        1, None, None, second.token.attempt, later(LEASE + 2)
    )


async def test_reports_do_not_disturb_the_heartbeat(backend: Backend) -> None:
    await enqueue(backend, new())
    [claimed] = await claim(backend)
    await backend.report_progress(ProgressParams("w1", [report(claimed.token, 1)], now=later(1)))
    beat = await backend.heartbeat(
        HeartbeatParams("w1", [claimed.token], lease=LEASE, now=later(2))
    )
    assert beat.renewed == {claimed.token}


async def test_a_corrupt_report_hides_nothing_else(backend: Backend) -> None:
    if type(backend).__name__ == "MemoryBackend":
        pytest.skip("nothing is written around the memory store")
    [task_id] = await enqueue(backend, new(payload={"n": 1}))
    [claimed] = await claim(backend)
    await backend.report_progress(ProgressParams("w1", [report(claimed.token, 1)], now=later(1)))
    for corrupt in ('{"done": -1, "total": null, "note": null, "attempt": 1}', "not json", "[]"):
        if type(backend).__name__ == "RedisBackend":
            await set_in_redis(backend, task_id, "progress", corrupt)
        else:
            await write_around(
                backend, "update {tasks} set progress = %s where id = %s", corrupt, task_id
            )
        task = await backend.get_task(task_id)
        assert task is not None
        assert (task.progress, task.payload, task.state) == (
            None,
            {"n": 1},
            TaskState.IN_PROGRESS,
        )
    if type(backend).__name__ == "RedisBackend":
        await set_in_redis(backend, task_id, "progress_at", "soon")
        task = await backend.get_task(task_id)
        assert task is not None and task.progress is None and task.payload == {"n": 1}


def test_the_one_rule_of_a_report() -> None:
    assert check_progress(0, None, None) == (0, None, None)
    assert check_progress(3, 3, "x" * 200) == (3, 3, "x" * 200)
    for done, total, note in (
        (-1, None, None),
        (True, None, None),
        (1.5, None, None),
        (2**53 + 1, None, None),
        (5, 4, None),
        (1, "10", None),
        (1, None, "two\nlines"),
        (1, None, "x" * 201),
        (1, None, b"bytes"),
    ):
        with pytest.raises(ConfigurationError):
            check_progress(done, total, note)
    assert later(1) > T0
