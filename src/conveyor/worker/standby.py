"""Standby: an idle worker offers free slots that enqueues fill directly.

With an idle worker, a claimed task starts after two durable commits: the
enqueue's, then the claim's. Where the store has hand-offs
(``Capability.HANDOFF``, PostgreSQL), an idle worker offers some of its
free slots instead, and an enqueue of one task due now leases the task to
it in the enqueue's own commit and tells it on a channel of its own (see
:class:`~conveyor.backends.protocol.HandOffs`): one commit, and no round
trip between the notice and the start.

How the worker keeps its slots:

- **What it offers.** At most half its slots (``concurrency // 2``; a
  worker of concurrency 1 offers none), only while idle (its last claim
  came back short, none in flight) and while its listener hears its
  channel. It tops the offer up as hand-offs finish, once half the offer
  is spent, not after each task.
- **Pledged slots.** Slots offered, plus hand-offs taken but not yet heard
  of, are pledged: the worker's claims leave them alone, so it never holds
  more tasks than its concurrency. When a claim is due and every other slot
  is taken, the worker withdraws the offer first: the store gives back the
  slots no enqueue took, and the rest it is owed are on their way.
- **Nothing handed off is lost.** A hand-off is an ordinary lease. Notices
  sent while the listener was away (a lost connection), or that do not
  arrive within :data:`ADOPT_AFTER` of a withdrawal, are read from the
  store (``adopt``), by the ids the worker does not hold. A worker that dies
  offering leaves at most its offer's slots to be handed off to it until
  the offer lapses (one lease after its last renewal); those tasks run
  again when their lease expires, as tasks a dead worker claimed do.
- **Leases are reckoned from the store's clock.** A hand-off's lease began
  at its enqueue, which the worker did not see. Each offer returns the
  store's clock; the worker's trust in a hand-off's lease counts from the
  offer's send time plus the store's time between that offer and the
  hand-off: never later than the lease really began, however late the
  notice arrives. A hand-off with less than a heartbeat interval of trust
  left is not started; its lease runs out and it is reclaimed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence

from conveyor.backends.protocol import ClaimedTask, HandOff, HandOffs, OfferParams
from conveyor.worker.config import beat_interval
from conveyor.worker.outage import Outage
from conveyor.worker.texts import reason

log = logging.getLogger("conveyor.worker")

ADOPT_AFTER = 1.0
"""Seconds after a withdrawal before hand-offs still owed are read from
the store rather than awaited from their notices."""

RETRY_MIN = 0.1
RETRY_MAX = 5.0
"""Seconds before a store call is tried again after one failed (doubling)."""

RENEWALS_PER_TTL = 3
"""An offer is renewed three times per its lapse time (the lease)."""

Start = Callable[[list[ClaimedTask], float], None]
"""Runs tasks whose leases count from the given ``time.monotonic()``."""


class Standby:
    """One worker's offer of slots. ``tick`` is called by the claim loop on
    every turn; store calls run one at a time, in the background, and call
    ``wake`` when they return."""

    def __init__(
        self,
        store: HandOffs,
        worker_id: str,
        queues: Sequence[str],
        names: Sequence[str],
        concurrency: int,
        lease: float,
        start: Start,
        wake: Callable[[], None],
        outage: Outage,
    ) -> None:
        self.store = store
        self.worker_id = worker_id
        self.queues = list(queues)
        self.names = list(names)
        self.cap = concurrency // 2
        self.lease = lease
        self.pledged = 0
        """Slots offered, or handed off and not heard of yet."""
        self.stored = False
        """Whether the worker's offer may be stored."""
        self.hearing = False
        self.handed_off = 0
        """Hand-offs started (heard or adopted)."""
        self._start = start
        self._wake = wake
        self._outage = outage
        self._held: set[int] = set()
        """Ids of hand-offs heard or adopted whose completion is not recorded."""
        self._adopted: set[int] = set()
        """Ids of hand-offs adopted whose notice may still come (until the
        listener's next connection): it must not start them again."""
        self._heard_meanwhile: set[int] | None = None
        """While an adoption is in flight, the ids heard meanwhile: they may
        come back from it, and may have finished already."""
        self._anchor: tuple[float, float] | None = None
        """``(time.monotonic() before the send, store clock)`` of the last offer."""
        self._first_sent: float | None = None
        self._renew_at = 0.0
        self._adopt_at: float | None = None
        self._call: asyncio.Task[None] | None = None
        self._closed = False
        self._retry_at = 0.0
        self._retry_delay = RETRY_MIN

    # -- the claim loop's side -------------------------------------------------

    def reserved(self) -> int:
        """Slots claims must leave alone."""
        return self.pledged

    def tick(self, now: float, idle: bool, free: int, claim_due: bool) -> None:
        """Start the store call the worker's state asks for, if none is in
        flight. ``free``: slots neither running nor reserved by claims;
        ``idle``: the last claim came back short and none is in flight;
        ``claim_due``: a claim would be sent now if a slot were left."""
        if self._closed or self.cap <= 0 or self._call is not None or now < self._retry_at:
            return
        if self.stored and claim_due and free - self.pledged <= 0:
            self._run(self._withdraw())
        elif self.stored and now >= self._renew_at:
            self._run(self._offer(0))
        elif not self.stored and self.pledged > 0:
            if self._adopt_at is None:
                self._adopt_at = now + ADOPT_AFTER
            elif now >= self._adopt_at:
                self._run(self._adopt(settle=True))
        elif idle and self.hearing:
            more = min(self.cap, free) - self.pledged
            if more >= (1 if self.pledged == 0 else max(1, self.cap // 2)):
                self._run(self._offer(more))

    def timeout(self, now: float) -> float | None:
        """Seconds until ``tick`` has something to do on its own clock."""
        if self._closed or self._call is not None:
            return None
        if now < self._retry_at:
            return self._retry_at - now
        if self.stored:
            return max(0.0, self._renew_at - now)
        if self.pledged > 0 and self._adopt_at is not None:
            return max(0.0, self._adopt_at - now)
        return None

    # -- the listener's side ---------------------------------------------------

    def heard(self, handoff: HandOff) -> None:
        """A hand-off's notice: start its task, unless already adopted."""
        task_id = handoff.task.token.task_id
        if task_id in self._adopted:
            self._adopted.discard(task_id)
            return
        if self._heard_meanwhile is not None:
            self._heard_meanwhile.add(task_id)
        self._take([handoff])

    def hearing_again(self) -> None:
        """The listener hears the worker's channel (again): notices sent while
        it did not may be lost, so hand-offs owed are read from the store."""
        first = not self.hearing and self._first_sent is None
        self.hearing = True
        self._adopted.clear()  # the notices sent to the last connection are gone
        if not first and (self.stored or self.pledged > 0) and not self._closed:
            self._run_after(self._adopt(settle=False))

    def deaf(self) -> None:
        """The listener stopped: offer nothing more, withdraw what is offered."""
        self.hearing = False
        if self.stored and not self._closed:
            self._run_after(self._withdraw())

    def recorded(self, task_id: int) -> None:
        """A task's completion is recorded: it is no longer in progress here."""
        self._held.discard(task_id)

    async def close(self) -> None:
        """Withdraw the offer and start every hand-off still owed (read from
        the store): none is left to wait out its lease. Hand-offs heard
        afterwards are not started (their tasks were read here)."""
        call, self._call = self._call, None
        if call is not None:
            with contextlib.suppress(Exception):
                await call
        self.hearing = False
        try:
            async with asyncio.timeout(self.lease):
                if self.stored:
                    await self._withdraw()
                if self.pledged > 0:
                    await self._adopt(settle=True)
        except Exception as exc:
            log.warning("cannot withdraw the offer of slots (%s): it lapses by itself", reason(exc))
        self._closed = True

    # -- store calls -----------------------------------------------------------

    def _run(self, call: Awaitable[None]) -> None:
        self._call = asyncio.ensure_future(self._guarded(call))

    def _run_after(self, call: Awaitable[None]) -> None:
        """Run ``call`` after the one in flight."""
        before = self._call

        async def after() -> None:
            if before is not None:
                with contextlib.suppress(BaseException):
                    await before
            await call

        self._run(after())

    async def _guarded(self, call: Awaitable[None]) -> None:
        try:
            async with asyncio.timeout(self.lease):
                await call
            self._outage.ok("offer")
            self._retry_delay = RETRY_MIN
        except Exception as exc:
            self._outage.failed("offer", exc)  # logged once per outage
            self._retry_at = time.monotonic() + self._retry_delay
            self._retry_delay = min(self._retry_delay * 2, RETRY_MAX)
        finally:
            if self._call is asyncio.current_task():
                self._call = None
            self._wake()

    async def _offer(self, more: int) -> None:
        sent = time.monotonic()
        if self._first_sent is None:
            self._first_sent = sent
        # Counted before it is sent: a hand-off may be heard before the reply.
        self.pledged += more
        was_stored, self.stored = self.stored, True
        params = OfferParams(
            self.worker_id, self.queues, self.names, more, self.lease, ttl=self.lease
        )
        offered = await self.store.offer(params)
        self._anchor = (sent, offered.clock)
        self._renew_at = sent + self.lease / RENEWALS_PER_TTL
        if offered.anew and was_stored:
            # The offer was cleared while this worker thought it stood (it
            # froze for a day): what it was owed is read from the store. The
            # slots it had are still counted pledged until the next
            # withdrawal settles them.
            log.warning("the offer of slots had lapsed and been cleared; offered anew")
            await self._adopt(settle=False)

    async def _withdraw(self) -> None:
        left = await self.store.withdraw(self.worker_id)
        self.stored = False
        self.pledged = max(0, self.pledged - left)
        self._adopt_at = None

    async def _adopt(self, settle: bool) -> None:
        """Start the hand-offs the store holds for this worker that it has
        not heard of. ``settle``: the offer is withdrawn, so after this
        nothing more is owed."""
        self._heard_meanwhile = set()
        try:
            found = await self.store.adopt(self.worker_id, sorted(self._held))
            fresh = [h for h in found if h.task.token.task_id not in self._heard_meanwhile]
        finally:
            self._heard_meanwhile = None
        if fresh:
            log.info("%d hand-offs whose notices did not arrive were read", len(fresh))
        self._adopted.update(h.task.token.task_id for h in fresh)
        self._take(fresh)
        if settle:
            self.pledged = 0
            self._adopt_at = None

    # -- starting --------------------------------------------------------------

    def _take(self, handoffs: list[HandOff]) -> None:
        if self._closed:
            return
        now = time.monotonic()
        beat = beat_interval(self.lease, None)
        for handoff in handoffs:
            task = handoff.task
            if task.token.task_id in self._held:
                continue
            self._held.add(task.token.task_id)
            self.pledged = max(0, self.pledged - 1)
            sent_at = self._lease_began(handoff.leased_at, now)
            if sent_at + (task.lease or self.lease) <= now + beat:
                log.warning(
                    "hand-off of task %s came too late to trust its lease; it runs when reclaimed",
                    task.token.task_id,
                )
                continue
            self.handed_off += 1
            self._start([task], sent_at)

    def _lease_began(self, leased_at: float, now: float) -> float:
        """The latest ``time.monotonic()`` the lease surely began after."""
        if self._anchor is not None:
            sent, clock = self._anchor
            return min(now, sent + (leased_at - clock))
        # No offer has returned yet: this hand-off filled a slot of the
        # first one, sent then.
        return self._first_sent if self._first_sent is not None else now - self.lease
