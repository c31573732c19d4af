"""Periodic schedules, the pure half: which slots a schedule has, and which are due.

A schedule enqueues its task once per *slot*, an instant computed here
without I/O. Workers enqueue each due slot under :meth:`Schedule.key`, a key
derived from the schedule name and the slot, so that the store lets one
enqueue per slot through, however many workers compute the same slot.

Interval schedules (``every``) have the slots ``1970-01-01T00:00Z + k * every``
for every integer ``k``: each process finds the same instants without
coordination, whenever it starts. ``every`` is rounded to the microsecond and
``tz`` plays no part.

Cron schedules (``cron``) read the five fields of a standard expression
(minute, hour, day of month, month, day of week; cronsim's syntax, so ``L``,
``LW`` and ``MON#2`` too) as wall-clock time in the zone ``tz``. A sixth,
seconds, field is refused: cronsim treats such expressions differently
across changes of the UTC offset, and ``every`` covers sub-minute periods.
Around daylight saving time (DST) conveyor promises the Debian cron
behaviour that cronsim implements:

* An expression whose minute and hour fields are both fixed (neither starts
  with ``*``: ``30 2 * * *``, ``0 9-17 * * MON-FRI``) follows the wall
  clock. Slots at wall times that do not exist fire once, at the first
  minute after the gap (all of them together, with a slot at that minute if
  there is one); a wall time that happens twice fires once, at its first
  occurrence (the earlier UTC instant). So ``0 0-23 * * *`` is not
  ``0 * * * *``: it fires once for the two 02:00 of a repeated hour.
* An expression whose minute or hour field starts with ``*`` (``0 * * * *``,
  ``*/15 * * * *``, ``30 */2 * * *``) follows real time: each wall time that
  exists fires, once per occurrence. A wall time in a gap does not fire; one
  that happens twice fires twice. So an hourly expression fires every real
  hour across a whole-hour change.

With ``tz="Europe/Paris"`` (CET, UTC+1; CEST, UTC+2 in summer):

* 2026-03-29, 02:00 to 03:00 does not exist. ``30 2 * * *`` fires at 03:00
  CEST = 01:00Z (and 01:30Z the day before, 00:30Z the day after).
  ``0 * * * *`` fires at 00:00Z (01:00 CET), 01:00Z (03:00 CEST), 02:00Z, ...;
  ``*/15 * * * *`` at 00:45Z (01:45 CET) then 01:00Z (03:00 CEST), 01:15Z, ...
* 2026-10-25, 02:00 to 03:00 happens twice. ``30 2 * * *`` fires once, at
  02:30 CEST = 00:30Z (and 01:30Z the day after). ``0 * * * *`` fires at
  23:00Z (24th), 00:00Z (02:00 CEST), 01:00Z (02:00 CET), 02:00Z (03:00 CET);
  ``*/15 * * * *`` at each quarter hour from 00:00Z to 01:45Z, eight slots
  for the two 02:xx hours.

In zones whose offset changes by 30 minutes (Australia/Lord_Howe) the same
rules hold: the hourly ``0 * * * *`` is then 1.5 h apart across a change.

Every slot is returned as an aware UTC datetime; slots of one schedule are
strictly increasing and the same whatever instant a computation starts from.
Not guaranteed: that a slot fires on time (that depends on running workers);
that processes agree on slots near a change of offset that their time zone
databases (the system's, or the tzdata package) date differently.
"""

from __future__ import annotations

import enum
import hashlib
import json
import math
import sys
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from conveyor.errors import ConfigurationError, ConveyorError
from conveyor.model import MAX_IDEMPOTENCY_KEY, MAX_SECONDS, check_name
from conveyor.records import StoredSchedule

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
"""The origin of interval slots."""
MAX_CATCH_UP = 1000
"""The largest ``catch_up``: the most missed slots a ``Missed.ALL`` schedule fires at once."""

_MICROSECOND = timedelta(microseconds=1)
_MINUTE = timedelta(minutes=1)


class Missed(enum.StrEnum):
    """What a schedule does with slots that passed while no worker fired them."""

    SKIP = "skip"
    """Drop them: only a slot at most ``grace`` seconds old fires."""
    LATEST = "latest"
    """Fire the latest missed slot once and drop the others (the default)."""
    ALL = "all"
    """Fire each, oldest first; at most ``catch_up`` of them, the most recent."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Schedule:
    """A task enqueued once per slot of a cron expression or of an interval.

    ``name`` identifies the schedule (unique per app; 1 to 200 printable
    characters), ``task`` is the name of the task it enqueues with ``args``
    (kept as given: they are encoded when enqueued). Exactly one of ``cron``
    (a five-field expression read in the IANA zone ``tz``) and ``every``
    (seconds, at least 1 and at most 100 years) is given. ``missed``,
    ``catch_up`` (1 to 1000) and ``grace`` (seconds, above 0) say what
    :meth:`due` fires after slots were missed. ``every`` and ``grace`` take a
    timedelta and ``missed`` its string value too, stored normalised (float
    seconds, a :class:`Missed`); ``cron`` is stored with single spaces.
    Every invalid field raises ConfigurationError.
    """

    name: str
    task: str
    cron: str | None = None
    every: float | None = None
    tz: str = "UTC"
    args: Mapping[str, Any] = field(default_factory=dict, hash=False)
    missed: Missed = Missed.LATEST
    catch_up: int = 10
    grace: float = 60.0

    def __post_init__(self) -> None:
        check_name("a schedule's name", self.name)
        check_name("a schedule's task", self.task)
        where = f"schedule {self.name!r}"
        if (self.cron is None) == (self.every is None):
            raise ConfigurationError(f"{where} needs exactly one of cron= and every=")
        zone = _zone(where, self.tz)
        if self.cron is not None:
            _check_cron(where, self.cron, zone)
            object.__setattr__(self, "cron", " ".join(self.cron.split()))
        if self.every is not None:
            object.__setattr__(self, "every", _seconds(f"{where}: every", self.every, 1.0))
        object.__setattr__(self, "grace", _seconds(f"{where}: grace", self.grace, 1e-6))
        if not isinstance(self.args, Mapping):
            raise ConfigurationError(f"{where}: args must be a mapping, not {self.args!r}")
        object.__setattr__(self, "missed", _missed(where, self.missed, self.catch_up))

    def next_slot(self, after: datetime) -> datetime:
        """The first slot strictly after the aware datetime ``after``, in UTC.

        Raises ConfigurationError for a naive ``after``, or when there is no
        slot after it (cronsim gives up after 50 years without one, and no
        datetime lies past the year 9999).
        """
        start = _utc("after", after)
        if self.every is None:
            slot = next(self._cron_after(start), None)
        else:
            try:
                slot = EPOCH + ((start - EPOCH) // self._step() + 1) * self._step()
            except OverflowError:
                slot = None
        if slot is None:
            raise ConfigurationError(f"schedule {self.name!r} has no slot after {start}")
        return slot

    def slots(self, after: datetime, until: datetime, limit: int) -> list[datetime]:
        """The slots strictly after ``after`` and at or before ``until``, oldest
        first, in UTC; when there are more than ``limit``, the last ``limit``.

        Interval slots are computed, not iterated: the cost is ``limit``
        whatever the range. Cron slots are iterated, but never over the whole
        range: each scan walks at most ``4 * limit + 5`` slots, in windows that
        end at ``until``, from ``limit`` minutes wide, doubled until one holds
        ``limit`` slots, then bisected if it holds too many (an uneven
        expression, such as ``* * * 1 *`` over years). That is at most about
        two scans per doubling of the range in minutes: a few milliseconds
        for ``limit=1``, up to about a second for ``limit=1000``. Raises
        ConfigurationError for a naive datetime or a ``limit`` below 1.
        """
        start, end = _utc("after", after), _utc("until", until)
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ConfigurationError(f"slots() takes a limit of 1 or more, not {limit!r}")
        if end <= start:
            return []
        if self.every is None:
            return self._cron_slots(start, end, limit)
        step = self._step()
        first, last = (start - EPOCH) // step + 1, (end - EPOCH) // step
        return [EPOCH + k * step for k in range(max(first, last - limit + 1), last + 1)]

    def due(self, last_slot: datetime | None, now: datetime) -> list[datetime]:
        """The slots to fire at ``now``, oldest first, by the ``missed`` policy.

        ``last_slot`` is the last slot already fired, or None for a schedule
        never fired. A new schedule does not fire retroactively: with None,
        the answer is ``[now]`` when ``now`` is exactly a slot and ``[]``
        otherwise; the caller then keeps ``now`` as ``last_slot`` (slots are
        counted strictly after it). With a ``last_slot``, among the slots
        after it and at or before ``now``: ``SKIP`` fires the most recent one
        if it is at most ``grace`` seconds old, ``LATEST`` the most recent
        one, ``ALL`` the last ``catch_up`` of them. A ``now`` at or before
        ``last_slot`` (a clock set back) fires nothing. Raises
        ConfigurationError for a naive datetime.
        """
        at = _utc("now", now)
        if last_slot is None:
            return self.slots(at - _MICROSECOND, at, 1)
        fired = _utc("last_slot", last_slot)
        if self.missed is Missed.ALL:
            return self.slots(fired, at, self.catch_up)
        latest = self.slots(fired, at, 1)
        if self.missed is Missed.SKIP and latest:
            return latest if (at - latest[0]).total_seconds() <= self.grace else []
        return latest

    def key(self, slot: datetime) -> str:
        """The idempotency key of this schedule's task for ``slot``:
        ``schedule:<name>:<slot in UTC, ISO 8601, with Z>``, the same in every
        process and at most 237 characters. Two schedules or two slots never
        share a key; a user's own key could, if it starts with ``schedule:``."""
        text = _utc("slot", slot).replace(tzinfo=None).isoformat()
        key = f"schedule:{self.name}:{text}Z"
        assert len(key) <= MAX_IDEMPOTENCY_KEY
        return key

    def fingerprint(self) -> str:
        """16 hex digits of the SHA-256 of the definition (everything but the
        name, ``args`` as JSON with sorted keys): a store compares it to tell
        a changed definition. Stable across processes and runs for JSON
        values; a value JSON cannot hold is hashed by its ``str()``."""
        definition = {
            "cron": self.cron,
            "every": self.every,
            "tz": self.tz,
            "task": self.task,
            "missed": self.missed.value,
            "catch_up": self.catch_up,
            "grace": self.grace,
            "args": dict(self.args),
        }
        text = json.dumps(definition, sort_keys=True, default=str, separators=(",", ":"))
        return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]

    def describe(self) -> str:
        """A short human description: ``cron '*/5 * * * *' in Europe/Paris``, ``every 600s``."""
        if self.every is not None:
            return f"every {self.every:.6f}".rstrip("0").rstrip(".") + "s"
        return f"cron '{self.cron}' in {self.tz}"

    def _step(self) -> timedelta:
        assert self.every is not None
        return timedelta(microseconds=round(self.every * 1_000_000))

    def _cron_after(self, after: datetime) -> Iterator[datetime]:
        """Cron slots strictly after ``after`` (UTC), strictly increasing."""
        assert self.cron is not None
        last = after
        try:
            for wall in CronSim(self.cron, after.astimezone(ZoneInfo(self.tz))):
                slot = wall.astimezone(UTC)
                # A start in the second pass of a repeated hour loses its fold in
                # cronsim's wall-clock mode, which then offers the first pass again.
                if slot > last:
                    last = slot
                    yield slot
        except (OverflowError, ValueError):
            return  # past the year 9999

    def _cron_slots(self, after: datetime, until: datetime, limit: int) -> list[datetime]:
        """The last ``limit`` cron slots in (after, until]: a window ending at
        ``until`` that holds ``limit`` to ``budget`` slots gives them in one
        scan. Slots are a minute apart or more, so a ``limit``-minute window
        holds at most ``limit``; doubling it, then halving the gap between a
        start that leaves too few (``sparse``) and one that leaves too many
        (``dense``), finds such a window, or a gap under a minute where
        ``dense`` leaves at most one slot more than ``sparse``."""
        budget = 4 * limit + 4
        sparse, dense = until, None
        span = until - after
        start = after if span.total_seconds() <= 60 * limit else until - timedelta(minutes=limit)
        while True:
            count, kept = self._count(start, until, limit, budget)
            if count <= budget and (count >= limit or start == after):
                return kept
            if count <= budget:
                sparse = start
            else:
                dense = start
            if dense is None:
                start = until - min(2 * (until - start), span)
            elif sparse - dense > _MINUTE:
                start = dense + (sparse - dense) / 2
            else:
                return self._count(dense, until, limit, sys.maxsize)[1]

    def _count(
        self, after: datetime, until: datetime, keep: int, budget: int
    ) -> tuple[int, list[datetime]]:
        """How many cron slots lie in (after, until] (up to ``budget + 1``), the last ``keep``."""
        kept: deque[datetime] = deque(maxlen=keep)
        count = 0
        for slot in self._cron_after(after):
            if slot > until or count > budget:
                break
            count += 1
            kept.append(slot)
        return count, list(kept)


def _check_cron(where: str, cron: object, zone: ZoneInfo) -> None:
    if not isinstance(cron, str) or len(cron.split()) != 5:
        raise ConfigurationError(
            f"{where}: cron={cron!r} must have five fields "
            "(minute hour day-of-month month day-of-week); use every= below a minute"
        )
    try:
        CronSim(cron, datetime(2000, 1, 1, tzinfo=zone))
    except CronSimError as exc:
        raise ConfigurationError(f"{where}: cron={cron!r} is not valid: {exc}") from None


def _zone(where: str, tz: object) -> ZoneInfo:
    try:
        if isinstance(tz, str) and tz:
            return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        pass
    raise ConfigurationError(f"{where}: tz={tz!r} is not an IANA time zone")


def _missed(where: str, missed: object, catch_up: object) -> Missed:
    """``missed`` as a :class:`Missed`, once it and ``catch_up`` are checked."""
    if isinstance(catch_up, bool) or not isinstance(catch_up, int):
        raise ConfigurationError(f"{where}: catch_up must be an integer, not {catch_up!r}")
    if not 1 <= catch_up <= MAX_CATCH_UP:
        raise ConfigurationError(f"{where}: catch_up must be from 1 to {MAX_CATCH_UP}")
    if isinstance(missed, str) and missed in Missed.__members__.values():
        return Missed(missed)
    choices = ", ".join(repr(m.value) for m in Missed)
    raise ConfigurationError(f"{where}: missed must be one of {choices}, not {missed!r}")


def _seconds(name: str, value: object, minimum: float) -> float:
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise ConfigurationError(f"{name} must be a number of seconds or a timedelta")
    if not math.isfinite(seconds) or not minimum <= seconds <= MAX_SECONDS:
        raise ConfigurationError(
            f"{name} must be from {minimum:g} to {MAX_SECONDS:.0f} seconds, not {value!r}"
        )
    return float(seconds)


def _utc(name: str, value: object) -> datetime:
    if not isinstance(value, datetime) or value.utcoffset() is None:
        raise ConfigurationError(f"{name} must be an aware datetime, not {value!r}")
    return value.astimezone(UTC)


def next_stored_slot(row: StoredSchedule, now: datetime) -> datetime | None:
    """When a stored schedule fires next, by its stored definition (None:
    the definition does not read, as one written by another version)."""
    try:
        schedule = Schedule(
            name=row.name,
            task=row.task,
            cron=row.cron,
            every=row.every,
            tz=row.tz,
            missed=row.missed,  # type: ignore[arg-type]  # its string value is taken too
            catch_up=row.catch_up,
        )
        return schedule.next_slot(max(now, row.last_slot or now))
    except ConveyorError:
        return None
