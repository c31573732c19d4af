"""Standby: an idle worker offers free slots that enqueues fill directly.

With an idle worker, a claimed task starts after two durable commits: the
enqueue's, then the claim's. Where the store has hand-offs
(``Capability.HANDOFF``, PostgreSQL), an idle worker offers some of its
free slots instead, and an enqueue of one task due now leases the task to
it in the enqueue's own commit and tells it on a channel of its own (see
:class:`~conveyor.backends.capabilities.HandOffs`): one commit, and no round
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
  store (``adopt``), by the ids the worker has not seen. Each offer also
  sends a numbered notice of its own: one not heard within
  :data:`HEAR_WITHIN` means the listener is deaf (a connection that died
  without a word), and the offer is withdrawn. A worker that dies offering
  leaves at most its offer's slots to be handed off to it until the offer
  lapses (one lease after its last renewal); those tasks run again when
  their lease expires, as tasks a dead worker claimed do.
- **Nothing runs twice.** Every hand-off heard or read is remembered until
  its lease has surely expired after its completion; a notice or read of a
  task seen starts nothing. Each worker process hears on a channel drawn
  from its own nonce, so a process restarted under the same worker id
  hears nothing of its predecessor's, and replaces its offer.
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
import logging
import math
import secrets
import time
from collections.abc import Awaitable, Callable, Sequence

from conveyor.backends.capabilities import HandOffs
from conveyor.backends.params import ClaimedTask, HandOff, HandOffsHeard, OfferParams
from conveyor.worker.config import beat_interval
from conveyor.worker.outage import Outage
from conveyor.worker.texts import reason

log = logging.getLogger("conveyor.worker")

ADOPT_AFTER = 1.0
"""Seconds after a withdrawal before hand-offs still owed are read from
the store rather than awaited from their notices."""

HEAR_WITHIN = 5.0
"""Seconds within which an offer's own notice must be heard; else the
listener is taken to be deaf and the offer is withdrawn."""

RETRY_MIN = 0.1
RETRY_MAX = 5.0
"""Seconds before a store call is tried again after one failed (doubling)."""

RENEWALS_PER_TTL = 3
"""An offer is renewed three times per its lapse time (the lease)."""

Start = Callable[[list[ClaimedTask], float], None]
"""Runs tasks whose leases count from the given ``time.monotonic()``."""


class Standby:
    """One worker process's offer of slots. ``tick`` is called by the claim
    loop on every turn, the ``heard``/``hearing`` methods by the listener;
    store calls run one at a time, in the background, and call ``wake``
    when they return."""

    def __init__(
        self,
        store: HandOffs,
        worker_id: str,
        queues: Sequence[str],
        names: Sequence[str],
        concurrency: int,
        lease: float,
        heartbeat_interval: float | None,
        start: Start,
        wake: Callable[[], None],
        outage: Outage,
    ) -> None:
        self.store = store
        self.worker_id = worker_id
        self.nonce = secrets.token_hex(8)
        self.queues = list(queues)
        self.names = list(names)
        self.cap = concurrency // 2
        self.lease = lease
        self.heartbeat_interval = heartbeat_interval
        self.pledged = 0
        """Slots offered, or handed off and not heard of yet."""
        self.stored = False
        """Whether the offer may be stored."""
        self.hearing = False
        """Whether the listener hears this process's channel."""
        self.handed_off = 0
        """Hand-offs started (heard or read from the store)."""
        self._start = start
        self._wake = wake
        self._outage = outage
        self._seen: dict[int, float] = {}
        """Each hand-off heard or read, by task id: minus its lease seconds
        while its completion is unrecorded, then the ``time.monotonic()``
        after which its lease has surely expired (and it is forgotten). A
        task seen is never started again."""
        self._anchor: tuple[float, float] | None = None
        """``(time.monotonic() before the send, store clock)`` of the last offer."""
        self._first_sent: float | None = None
        """When the first offer since the offer was last settled was sent."""
        self._renew_at = 0.0
        self._adopt_at: float | None = None
        self._pings: dict[int, float] = {}
        """Send times of offers whose notice is not heard yet, by ping."""
        self._ping = 0
        self._lock = asyncio.Lock()
        self._call: asyncio.Task[None] | None = None
        self._closing = False
        self._retry_at = 0.0
        self._retry_delay = RETRY_MIN

    @property
    def standing(self) -> bool:
        """Whether an offer with a free slot is stored: its statement
        returned, and no other store call is under way."""
        return self.stored and self.pledged > 0 and self._anchor is not None and self._call is None

    @property
    def listen_as(self) -> tuple[str, str]:
        """The worker id and nonce the listener hears hand-offs for."""
        return self.worker_id, self.nonce

    # -- the claim loop's side -------------------------------------------------

    def reserved(self) -> int:
        """Slots claims must leave alone."""
        return self.pledged

    def tick(self, now: float, idle: bool, free: int, claim_due: bool) -> None:
        """Start the store call the worker's state asks for, if none is in
        flight. ``free``: slots neither running nor reserved by claims;
        ``idle``: the last claim came back short and none is in flight;
        ``claim_due``: a claim is to be sent now if a slot is left."""
        if self._closing or self.cap <= 0 or self._call is not None or now < self._retry_at:
            return
        if self.stored and self.hearing and self._pings and now > self._unheard() + HEAR_WITHIN:
            log.warning("the listener does not hear its hand-offs; the offer of slots is withdrawn")
            self.hearing = False
        if self.stored and (not self.hearing or (claim_due and free - self.pledged <= 0)):
            self._run(self._withdraw)
        elif self.stored and now >= self._renew_at:
            self._run(self._renew)
        elif not self.stored and self.pledged > 0:
            if self._adopt_at is None:
                self._adopt_at = now + ADOPT_AFTER
            elif now >= self._adopt_at:
                self._run(self._settle)
        elif idle and not claim_due and self.hearing:
            more = min(self.cap, free) - self.pledged
            if more >= (1 if self.pledged == 0 else max(1, self.cap // 2)):
                # Pledged now: a claim sent in this turn must leave them alone.
                fresh = not self.stored
                self.pledged += more
                self.stored = True
                if self._first_sent is None:
                    self._first_sent = now
                self._run(lambda: self._offer(more, fresh))

    def timeout(self, now: float) -> float | None:
        """Seconds until ``tick`` has something to do on its own clock."""
        if self._closing or self._call is not None:
            return None
        deadlines = [self._retry_at] if now < self._retry_at else []
        if self.stored:
            deadlines.append(self._renew_at)
            if self._pings:
                deadlines.append(self._unheard() + HEAR_WITHIN)
        elif self.pledged > 0 and self._adopt_at is not None:
            deadlines.append(self._adopt_at)
        return max(0.0, min(deadlines) - now) if deadlines else None

    # -- the listener's side ---------------------------------------------------

    def heard(self, handoff: HandOff) -> None:
        """A hand-off's notice: start its task, unless seen already."""
        self._take([handoff])

    def hearing_changed(self, heard: HandOffsHeard) -> None:
        """The listener connected, heard an offer's own notice, or lost its
        connection. On a new connection, notices sent while the listener
        was away may be lost: hand-offs owed are read from the store."""
        if heard.lost:
            self.hearing = False
            return
        if not heard.connected:
            if heard.ping is not None:
                self._pings.pop(heard.ping, None)
            self.hearing = True
            return
        self._pings.clear()  # sent to the connection that is gone
        self.hearing = True
        if (self.stored or self.pledged > 0) and not self._closing:
            self._run(self._adopt, after=True)

    def deaf(self) -> None:
        """The listener stopped for good: the next tick withdraws the offer."""
        self.hearing = False

    def recorded(self, task_id: int) -> None:
        """A task's completion is recorded (or refused): forget it once its
        lease has surely expired."""
        lease = self._seen.get(task_id)
        if lease is not None and lease < 0:
            self._seen[task_id] = time.monotonic() - lease

    async def close(self) -> None:
        """Withdraw the offer and start every hand-off still owed (read from
        the store): none is left to wait out its lease. Hand-offs heard
        afterwards are not started; nor, if the store cannot be reached,
        are those owed: they run when their leases expire."""
        self._closing = True
        async with self._lock:
            try:
                async with asyncio.timeout(self.lease):
                    owed = self.stored or self.pledged > 0
                    if self.stored:
                        await self._withdraw()
                    if owed:  # else every hand-off was heard or read before
                        await self._settle()
            except Exception as exc:
                log.warning("cannot withdraw the offer of slots (%s); it lapses", reason(exc))
        self.cap = 0

    # -- store calls -----------------------------------------------------------

    def _run(self, call: Callable[[], Awaitable[None]], after: bool = False) -> None:
        """Run ``call`` in the background, after any store call under way."""
        task = asyncio.ensure_future(self._guarded(call))
        if not after or self._call is None:
            self._call = task

    async def _guarded(self, call: Callable[[], Awaitable[None]]) -> None:
        try:
            async with self._lock:
                if self._closing:
                    return
                async with asyncio.timeout(self.lease):
                    await call()
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

    async def _offer(self, more: int, fresh: bool = False) -> None:
        sent = time.monotonic()
        self._ping += 1
        ping = self._ping
        # Listened for before it is sent: it may be heard before the reply.
        self._pings[ping] = sent
        params = OfferParams(
            self.worker_id,
            self.nonce,
            self.queues,
            self.names,
            more,
            self.lease,
            ttl=self.lease,
            ping=ping,
        )
        try:
            offered = await self.store.offer(params)
        except BaseException:
            self._pings.pop(ping, None)  # perhaps never sent
            raise
        self._anchor = (sent, offered.clock)
        self._renew_at = sent + self.lease / RENEWALS_PER_TTL
        if offered.anew and not fresh:
            # The offer was cleared while this worker thought it stood (it
            # froze for a day): what it was owed is read from the store. The
            # slots it had stay pledged until the next withdrawal settles them.
            log.warning("the offer of slots had lapsed and was cleared; offered anew")
            await self._adopt()

    async def _renew(self) -> None:
        self._forget(time.monotonic())
        await self._offer(0)

    async def _withdraw(self) -> None:
        left = await self.store.withdraw(self.worker_id)
        self.stored = False
        self.pledged = max(0, self.pledged - left)
        self._adopt_at = None
        self._pings.clear()

    async def _adopt(self) -> None:
        """Start the hand-offs the store holds for this worker that it has
        not seen."""
        self._forget(time.monotonic())
        found = await self.store.adopt(self.worker_id, list(self._seen))
        fresh = [h for h in found if h.task.token.task_id not in self._seen]
        if fresh:
            log.info("%d hand-offs whose notices did not arrive were read", len(fresh))
        self._take(fresh)

    async def _settle(self) -> None:
        """After a withdrawal: read what is still owed; then nothing is."""
        await self._adopt()
        self.pledged = 0
        self._adopt_at = None
        self._anchor = self._first_sent = None

    def _unheard(self) -> float:
        """When the oldest offer whose notice is not heard was sent."""
        return min(self._pings.values())

    def _forget(self, now: float) -> None:
        for task_id in [i for i, until in self._seen.items() if 0 <= until < now]:
            del self._seen[task_id]

    # -- starting --------------------------------------------------------------

    def _take(self, handoffs: list[HandOff]) -> None:
        if self._closing and self.cap == 0:
            return
        now = time.monotonic()
        for handoff in handoffs:
            task = handoff.task
            task_id = task.token.task_id
            if task_id in self._seen:
                continue
            lease = task.lease or self.lease
            self._seen[task_id] = -lease
            if self.pledged > 0:
                self.pledged -= 1
            else:
                log.debug("hand-off of task %s beyond the slots pledged", task_id)
            sent_at = self._lease_began(handoff.leased_at, now)
            margin = beat_interval(min(lease, self.lease), self.heartbeat_interval)
            if sent_at + lease <= now + margin:
                self._seen[task_id] = now + lease
                log.warning(
                    "hand-off of task %s came too late to trust its lease; it runs when reclaimed",
                    task_id,
                )
                continue
            self.handed_off += 1
            self._start([task], sent_at)

    def _lease_began(self, leased_at: float, now: float) -> float:
        """The latest ``time.monotonic()`` the lease surely began after (or
        minus infinity when nothing says)."""
        if self._anchor is not None:
            sent, clock = self._anchor
            return min(now, sent + (leased_at - clock))
        if self._first_sent is not None:
            # No offer has returned since the last settled one: this
            # hand-off filled a slot of an offer sent since then.
            return self._first_sent
        return -math.inf
