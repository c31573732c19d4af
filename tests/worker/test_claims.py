"""Claims in flight and the claim pace, without a backend."""

from __future__ import annotations

import asyncio

import pytest

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


async def test_a_worker_searches_for_expired_leases_once_per_poll_interval() -> None:
    """Claims between those searches skip them (PostgreSQL's claim is leaner
    without), so an expired lease waits at most a poll interval, as it did
    for an idle worker."""
    import time
    import uuid

    import conveyor
    from conveyor.backends.memory import MemoryBackend
    from conveyor.backends.protocol import ClaimedTask, ClaimParams
    from conveyor.errors import BackendUnavailableError

    asked: list[bool] = []

    class Recording(MemoryBackend):
        async def claim(self, params: ClaimParams) -> list[ClaimedTask]:
            asked.append(params.reclaim)
            return await super().claim(params)

    app = conveyor.App(f"memory://{uuid.uuid4().hex}")

    @app.task()
    async def job() -> None:
        return None

    class Failing(Recording):
        async def claim(self, params: ClaimParams) -> list[ClaimedTask]:
            asked.append(params.reclaim)
            raise BackendUnavailableError("the store is away")

    worker = app.worker(poll_interval=0.3, handle_signals=False)
    backend = Recording(uuid.uuid4().hex)
    for _ in range(3):
        await worker._claim(backend, 1)
    time.sleep(0.35)
    await worker._claim(backend, 1)
    assert asked == [True, False, False, True]
    # A searching claim that fails leaves the search to the next claim.
    time.sleep(0.35)
    with pytest.raises(BackendUnavailableError):
        await worker._claim(Failing(uuid.uuid4().hex), 1)
    await worker._claim(backend, 1)
    await worker._claim(backend, 1)
    assert asked == [True, False, False, True, True, True, False]
