"""Claims in flight and the claim pace, without a backend."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from conveyor.errors import BackendError
from conveyor.worker.claims import RETRY_MAX, RETRY_MIN, Claims, Pace


async def test_claims_overlap_in_half_batches_and_reserve_their_slots() -> None:
    woken: list[int] = []
    claims = Claims(concurrency=10, on_done=lambda: woken.append(1))
    gates = [asyncio.get_running_loop().create_future() for _ in range(3)]
    asked: list[int] = []

    async def claim(limit: int) -> list:  # type: ignore[type-arg]
        asked.append(limit)
        return await gates[len(asked) - 1]

    assert claims.batch == 5
    assert claims.may_send(10)
    claims.send(claim, 10)
    assert claims.reserved == 5
    # Nothing says more work is queued yet: the first claim goes alone.
    assert not claims.may_send(5)
    await asyncio.sleep(0)
    gates[0].set_result(["a"] * 5)
    await asyncio.sleep(0)
    [first] = claims.collect()
    assert (first.limit, first.result) == (5, ["a"] * 5)
    assert claims.reserved == 0 and claims.flowing
    await asyncio.sleep(0)
    assert woken == [1]  # the worker's loop is woken for each returned claim
    claims.send(claim, 5)
    # It came back full: a second claim overlaps, for a whole batch of free slots.
    assert not claims.may_send(4)
    assert claims.may_send(5)
    claims.send(claim, 5)
    assert claims.reserved == 10 and len(claims) == 2
    assert not claims.may_send(5)  # two in flight at most
    await asyncio.sleep(0)
    assert asked == [5, 5, 5]
    gates[2].set_result(["b"])
    await asyncio.sleep(0)
    [third] = claims.collect()
    assert (third.limit, third.result) == (5, ["b"])
    assert claims.reserved == 5
    gates[1].set_exception(OSError("gone"))
    [second] = await claims.settle()
    assert isinstance(second.result, OSError)
    assert claims.reserved == 0 and len(claims) == 0


async def test_a_short_or_failed_claim_ends_the_overlap() -> None:
    """A worker woken for one task sends one claim: two would race for it."""
    claims = Claims(concurrency=10, on_done=lambda: None)
    loop = asyncio.get_running_loop()
    gates: list[asyncio.Future[list[str]]] = []

    async def claim(limit: int) -> list[str]:
        gates.append(loop.create_future())
        return await gates[-1]

    overlap = []
    for result in (["a"] * 5, ["b"], ["c"] * 5, OSError("gone"), []):
        claims.send(claim, 10)
        await asyncio.sleep(0)
        overlap.append(claims.may_send(5))  # after the result before this one
        if isinstance(result, BaseException):
            gates[-1].set_exception(result)
        else:
            gates[-1].set_result(result)
        await claims.settle()
    # Nothing had come back before the first; then full, short, full, failed.
    assert overlap == [False, True, False, True, False]
    assert claims.may_send(10)  # none in flight: one claim may always go


async def test_one_free_slot_is_claimed_when_no_claim_is_in_flight() -> None:
    claims = Claims(concurrency=1, on_done=lambda: None)
    assert claims.batch == 1 and claims.size(1) == 1
    assert not claims.may_send(0)
    assert claims.may_send(1)


def test_a_short_claim_waits_for_a_hint_or_the_poll_interval() -> None:
    pace = Pace(poll_interval=2.0)
    assert pace.may_claim(0.0) and pace.timeout(0.0) is None
    pace.returned(claimed=3, limit=3, sent_at=0.0, now=0.0)  # full: more may be due
    assert pace.may_claim(0.1)
    pace.returned(claimed=1, limit=3, sent_at=0.9, now=1.0)  # short: nothing more is due
    assert not pace.may_claim(1.5)
    assert pace.timeout(1.5) == pytest.approx(1.5)
    assert pace.may_claim(3.0)  # the poll interval passed
    pace.returned(claimed=0, limit=3, sent_at=3.9, now=4.0)
    pace.hinted(4.05)
    assert pace.may_claim(4.1)


def test_a_hint_that_arrives_while_a_claim_is_in_flight_outlives_its_short_result() -> None:
    """The claim may have run before the hinted work was committed: its empty
    result says nothing about that work, which must not wait for the poll."""
    pace = Pace(poll_interval=60.0)
    pace.hinted(1.0)  # before the claim was sent: the claim saw that work
    pace.returned(claimed=0, limit=3, sent_at=1.5, now=2.0)
    assert not pace.may_claim(2.1)
    pace.hinted(2.2)  # while the next claim (sent at 2.1) was in flight
    pace.returned(claimed=0, limit=3, sent_at=2.1, now=2.3)
    assert pace.may_claim(2.3)
    pace.returned(claimed=0, limit=3, sent_at=2.4, now=2.5)  # this one saw it
    assert not pace.may_claim(2.6)


def test_failed_claims_back_off_doubling_up_to_the_cap() -> None:
    pace = Pace(poll_interval=1.0)
    delays = [pace.failed(now=0.0) for _ in range(8)]
    assert delays[:3] == [RETRY_MIN, RETRY_MIN * 2, RETRY_MIN * 4]
    assert max(delays) == RETRY_MAX
    assert not pace.may_claim(RETRY_MAX - 0.01)
    assert pace.timeout(0.0) == pytest.approx(RETRY_MAX)
    pace.returned(claimed=1, limit=1, sent_at=RETRY_MAX, now=RETRY_MAX)
    assert pace.failed(now=RETRY_MAX) == RETRY_MIN  # a success resets the delay


def test_a_sweep_is_due_once_per_interval_and_again_after_a_failed_one() -> None:
    """Claims between sweeps skip the search for expired leases (PostgreSQL's
    claim is leaner without), so an expired lease waits at most an interval."""
    import time

    from conveyor.backends.sweep import Sweep

    sweep = Sweep(0.3)
    asked = [sweep.due() for _ in range(3)]
    time.sleep(0.35)
    asked.append(sweep.due())
    assert asked == [True, False, False, True]
    # A sweeping claim that fails leaves the sweep to the next claim.
    sweep.missed()
    assert [sweep.due(), sweep.due()] == [True, False]
    assert [Sweep().due(), Sweep().due()] == [True, True]  # default: every claim sweeps


async def test_a_worker_sweeps_once_per_poll_interval(tmp_path: Path) -> None:
    """The worker builds its backend with its poll interval as the sweep
    interval: an expired lease waits for a sweep no longer than for a poll."""
    import conveyor

    app = conveyor.App(f"sqlite:///{tmp_path / 'tasks.db'}")

    @app.task()
    async def job() -> None:
        return None

    worker = app.worker(poll_interval=0.3, handle_signals=False, burst=True)
    await worker.run()
    assert worker.backend is not None
    assert worker.backend._sweep.interval == 0.3  # type: ignore[attr-defined]


async def test_a_failed_sweeping_claim_leaves_the_sweep_to_the_next_claim(
    tmp_path: Path,
) -> None:
    from conveyor.backends.params import ClaimParams
    from conveyor.backends.sqlite import SQLiteBackend

    backend = SQLiteBackend(str(tmp_path / "tasks.db"), sweep_interval=3600)
    params = ClaimParams("w", ("job",), ("default",), limit=1, lease=30.0)
    with pytest.raises(BackendError):  # not open: the claim fails
        await backend.claim(params)
    await backend.open()
    try:
        assert backend._sweep.due()  # the failed claim's sweep is still owed
        assert not backend._sweep.due()
    finally:
        await backend.close()
