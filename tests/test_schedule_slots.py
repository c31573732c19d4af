"""Schedules, the pure half: slots of cron and interval schedules, DST, the missed policies."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from functools import cache
from itertools import pairwise
from typing import Any
from zoneinfo import ZoneInfo

import cronsim
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conveyor import schedules
from conveyor.errors import ConfigurationError
from conveyor.schedules import Missed, Schedule


def utc(
    year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0, us: int = 0
) -> datetime:
    return datetime(year, month, day, hour, minute, second, us, tzinfo=UTC)


def cron(expr: str, tz: str = "UTC", **kwargs: Any) -> Schedule:
    return Schedule(name="report", task="send_report", cron=expr, tz=tz, **kwargs)


def every(seconds: Any, **kwargs: Any) -> Schedule:
    # Any: a timedelta is taken at run time, though the field is typed as its float.
    return Schedule(name="tick", task="tick", every=seconds, **kwargs)


def day(schedule: Schedule, start: datetime, hours: int = 8) -> list[datetime]:
    return schedule.slots(start, start + timedelta(hours=hours), 1000)


# Cron slots


def test_cron_slots_in_utc() -> None:
    schedule = cron("*/5 * * * *")
    assert schedule.next_slot(utc(2026, 1, 1, 0, 2)) == utc(2026, 1, 1, 0, 5)
    assert schedule.next_slot(utc(2026, 1, 1, 0, 5)) == utc(2026, 1, 1, 0, 10), "strictly after"
    assert schedule.slots(utc(2026, 1, 1), utc(2026, 1, 1, 0, 20), 10) == [
        utc(2026, 1, 1, 0, 5),
        utc(2026, 1, 1, 0, 10),
        utc(2026, 1, 1, 0, 15),
        utc(2026, 1, 1, 0, 20),
    ]


def test_cron_fields_are_wall_clock_time_in_the_zone() -> None:
    weekdays = cron("0 9 * * MON-FRI", tz="Europe/Paris")
    assert weekdays.next_slot(utc(2026, 1, 2, 12)) == utc(2026, 1, 5, 8)  # Fri -> Mon, CET
    assert weekdays.next_slot(utc(2026, 7, 1, 12)) == utc(2026, 7, 2, 7)  # CEST
    assert cron("0 9 * * *", tz="Asia/Kolkata").next_slot(utc(2026, 5, 1)) == utc(2026, 5, 1, 3, 30)


def test_slots_are_aware_utc_whatever_zone_the_inputs_are_in() -> None:
    paris = ZoneInfo("Europe/Paris")
    slot = cron("30 8 * * *", tz="America/New_York").next_slot(datetime(2026, 6, 1, tzinfo=paris))
    assert slot == utc(2026, 6, 1, 12, 30)
    assert slot.tzinfo is UTC


# DST, Europe/Paris: 2026-03-29 02:00-03:00 does not exist; 2026-10-25 02:00-03:00 happens twice.


def test_daily_wall_time_in_the_spring_gap_fires_once_right_after_it() -> None:
    assert day(cron("30 2 * * *", tz="Europe/Paris"), utc(2026, 3, 27, 12), hours=72) == [
        utc(2026, 3, 28, 1, 30),  # 02:30 CET
        utc(2026, 3, 29, 1, 0),  # 03:00 CEST, the first minute after the gap
        utc(2026, 3, 30, 0, 30),  # 02:30 CEST
    ]


def test_daily_wall_time_repeated_in_the_fall_fires_once_at_its_first_occurrence() -> None:
    assert day(cron("30 2 * * *", tz="Europe/Paris"), utc(2026, 10, 23, 12), hours=72) == [
        utc(2026, 10, 24, 0, 30),  # 02:30 CEST
        utc(2026, 10, 25, 0, 30),  # 02:30 CEST, not again at 02:30 CET (01:30Z)
        utc(2026, 10, 26, 1, 30),  # 02:30 CET
    ]


def test_a_start_in_the_second_pass_of_the_repeated_hour_does_not_go_back() -> None:
    # 01:10Z is 02:10 CET, the second 02:10; cronsim alone offers 02:30 CEST (00:30Z).
    schedule = cron("30 2 * * *", tz="Europe/Paris")
    assert schedule.next_slot(utc(2026, 10, 25, 1, 10)) == utc(2026, 10, 26, 1, 30)


def test_gap_slots_of_a_fixed_expression_fire_once_together() -> None:
    spring = utc(2026, 3, 28, 22)
    for expr in ("0,30 2 * * *", "0 2,3 * * *"):
        assert day(cron(expr, tz="Europe/Paris"), spring) == [utc(2026, 3, 29, 1)], expr
    # A fixed hour range follows the wall clock: one 02:00 on the day it repeats.
    assert day(cron("0 0-23 * * *", tz="Europe/Paris"), utc(2026, 10, 25, 0, 30), hours=2) == [
        utc(2026, 10, 25, 2)
    ]


def test_hourly_fires_every_real_hour_across_both_changes() -> None:
    hourly = cron("0 * * * *", tz="Europe/Paris")
    assert day(hourly, utc(2026, 3, 28, 22, 30), hours=4) == [
        utc(2026, 3, 28, 23),  # 00:00 CET
        utc(2026, 3, 29, 0),  # 01:00 CET
        utc(2026, 3, 29, 1),  # 03:00 CEST
        utc(2026, 3, 29, 2),  # 04:00 CEST
    ]
    assert day(hourly, utc(2026, 10, 24, 22, 30), hours=4) == [
        utc(2026, 10, 24, 23),  # 01:00 CEST
        utc(2026, 10, 25, 0),  # 02:00 CEST
        utc(2026, 10, 25, 1),  # 02:00 CET
        utc(2026, 10, 25, 2),  # 03:00 CET
    ]


def test_every_fifteen_minutes_follows_real_time_across_both_changes() -> None:
    quarters = cron("*/15 * * * *", tz="Europe/Paris")
    spring = day(quarters, utc(2026, 3, 29, 0, 30), hours=1)
    assert spring == [
        utc(2026, 3, 29, 0, 45),  # 01:45 CET
        utc(2026, 3, 29, 1),  # 03:00 CEST
        utc(2026, 3, 29, 1, 15),
        utc(2026, 3, 29, 1, 30),
    ]
    fall = day(quarters, utc(2026, 10, 24, 23, 50), hours=2)
    assert fall == [utc(2026, 10, 25, 0) + timedelta(minutes=15 * n) for n in range(8)]
    assert [slot.astimezone(ZoneInfo("Europe/Paris")).strftime("%H:%M") for slot in fall] == [
        "02:00", "02:15", "02:30", "02:45", "02:00", "02:15", "02:30", "02:45"
    ]  # fmt: skip


def test_new_york_changes() -> None:
    # 2026-03-08 02:00 EST -> 03:00 EDT; 2026-11-01 02:00 EDT -> 01:00 EST.
    assert day(cron("30 2 * * *", tz="America/New_York"), utc(2026, 3, 8)) == [utc(2026, 3, 8, 7)]
    assert day(cron("30 1 * * *", tz="America/New_York"), utc(2026, 11, 1)) == [
        utc(2026, 11, 1, 5, 30)  # 01:30 EDT only, not 01:30 EST
    ]
    assert day(cron("0 * * * *", tz="America/New_York"), utc(2026, 11, 1, 4, 30), hours=3) == [
        utc(2026, 11, 1, 5),  # 01:00 EDT
        utc(2026, 11, 1, 6),  # 01:00 EST
        utc(2026, 11, 1, 7),  # 02:00 EST
    ]


def test_half_hour_changes_of_lord_howe() -> None:
    # 2026-10-04 02:00 (+10:30) -> 02:30 (+11); 2026-04-05 02:00 (+11) -> 01:30 (+10:30).
    lord_howe = "Australia/Lord_Howe"
    assert day(cron("0 2 * * *", tz=lord_howe), utc(2026, 10, 3, 12)) == [utc(2026, 10, 3, 15, 30)]
    assert day(cron("0 * * * *", tz=lord_howe), utc(2026, 10, 3, 14), hours=2) == [
        utc(2026, 10, 3, 14, 30),  # 01:00 +10:30
        utc(2026, 10, 3, 16),  # 03:00 +11
    ]
    assert day(cron("45 1 * * *", tz=lord_howe), utc(2026, 4, 4, 12)) == [utc(2026, 4, 4, 14, 45)]
    assert day(cron("*/15 * * * *", tz=lord_howe), utc(2026, 4, 4, 14, 20), hours=1) == [
        utc(2026, 4, 4, 14, 30),  # 01:30 +11
        utc(2026, 4, 4, 14, 45),  # 01:45 +11
        utc(2026, 4, 4, 15),  # 01:30 +10:30
        utc(2026, 4, 4, 15, 15),  # 01:45 +10:30
    ]


ZONES = ["UTC", "Europe/Paris", "America/New_York", "Australia/Lord_Howe", "Asia/Kolkata"]
ZONES += ["America/Santiago", "Asia/Beirut"]  # offsets that change at midnight
EXPRESSIONS = ["30 2 * * *", "0 * * * *", "*/15 * * * *", "0 0 * * *", "30 */2 * * *"]
EXPRESSIONS += ["* 2 * * *", "0,30 0-3 * * *", "45 1 * * SUN", "5 4 1 * *"]
IN_2026 = st.datetimes(datetime(2026, 1, 1), datetime(2026, 12, 31), timezones=st.just(UTC))


@cache
def offset_changes(tz: str) -> list[datetime]:
    """The instants of 2026 at which the zone's UTC offset changes, to the minute."""
    zone, changes = ZoneInfo(tz), []
    for days in range(365):
        noon = utc(2026, 1, 1, 12) + timedelta(days=days)
        if (
            noon.astimezone(zone).utcoffset()
            != (noon + timedelta(days=1)).astimezone(zone).utcoffset()
        ):
            minute = noon
            while minute.astimezone(zone).utcoffset() == noon.astimezone(zone).utcoffset():
                minute += timedelta(minutes=1)
            changes.append(minute)
    return changes


def starts(tz: str) -> st.SearchStrategy[datetime]:
    """Any instant of 2026, or one within 12 hours of a change of offset."""
    near = [
        st.sampled_from(changes).flatmap(
            lambda change: st.timedeltas(timedelta(hours=-12), timedelta(hours=12)).map(
                lambda delta: change + delta
            )
        )
        for changes in [offset_changes(tz)]
        if changes
    ]
    return st.one_of(IN_2026, *near)


@settings(deadline=None, max_examples=400)
@given(
    expr=st.sampled_from(EXPRESSIONS),
    tz=st.sampled_from(ZONES),
    data=st.data(),
    minutes=st.integers(1, 72 * 60),
    later=st.floats(0, 1),
)
def test_slots_are_strictly_increasing_and_the_same_from_any_start(
    expr: str, tz: str, data: st.DataObject, minutes: int, later: float
) -> None:
    schedule = cron(expr, tz=tz)
    start = data.draw(starts(tz))
    until = start + timedelta(minutes=minutes)
    slots = schedule.slots(start, until, 10_000)
    assert all(a < b for a, b in pairwise(slots))
    assert all(start < slot <= until for slot in slots)
    assert len(slots) < 10_000
    if slots:
        assert schedule.next_slot(start) == slots[0]
    # A second start inside the range sees the same slots after it, no other.
    middle = start + (until - start) * later
    assert schedule.slots(middle, until, 10_000) == [s for s in slots if s > middle]
    assert schedule.slots(start, until, 3) == slots[-3:]


@pytest.mark.parametrize("expr", ["* * * 1 *", "*/2 * * 1-3 *", "0 0 29 2 *", "* 0 1 * *"])
def test_limit_keeps_the_most_recent_of_uneven_expressions(expr: str) -> None:
    schedule = cron(expr, tz="Europe/Paris")
    start, until = utc(2026, 1, 1), utc(2026, 12, 15)
    every_slot = schedule.slots(start, until, 10**6)
    for limit in (1, 7, 1000):
        assert schedule.slots(start, until, limit) == every_slot[-limit:]


class CountingCronSim(cronsim.CronSim):
    drawn = 0

    def __next__(self) -> datetime:
        CountingCronSim.drawn += 1
        return super().__next__()


@pytest.mark.parametrize("expr", ["* * * * *", "* * * 1 *", "0 0 29 2 *"])
def test_cron_slots_with_a_limit_do_not_walk_the_whole_range(
    expr: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(schedules, "CronSim", CountingCronSim)
    CountingCronSim.drawn = 0
    last = cron(expr, tz="Europe/Paris").slots(utc(1980, 1, 1), utc(2026, 6, 1), 10)
    assert len(last) == 10
    assert CountingCronSim.drawn < 5_000, "46 years of minutes is 24 million slots"


# Interval slots


def test_interval_slots_are_aligned_on_the_epoch() -> None:
    ten_minutes = every(600)
    assert ten_minutes.next_slot(utc(2026, 1, 1, 0, 7, 13)) == utc(2026, 1, 1, 0, 10)
    assert ten_minutes.next_slot(utc(2026, 1, 1, 0, 10)) == utc(2026, 1, 1, 0, 20)
    seven = every(7).slots(utc(2026, 5, 5), utc(2026, 5, 5, 0, 1), 100)
    assert all(slot.timestamp() % 7 == 0 for slot in seven)
    assert [b - a for a, b in pairwise(seven)] == [timedelta(seconds=7)] * 7


def test_interval_slots_agree_between_starts_and_ignore_the_zone() -> None:
    early = every(timedelta(minutes=7)).slots(utc(2026, 1, 1), utc(2026, 1, 2), 1000)
    late = every(420, tz="Asia/Kolkata").slots(utc(2026, 1, 1, 5, 3, 2), utc(2026, 1, 2), 1000)
    assert late == [slot for slot in early if slot > utc(2026, 1, 1, 5, 3, 2)]
    assert early[0] == every(420).next_slot(datetime(2026, 1, 1, 1, tzinfo=ZoneInfo("Etc/GMT-1")))


def test_interval_slots_with_a_limit_are_computed_not_iterated() -> None:
    # Ten years of seconds, and then all of datetime's range: an iteration would time out.
    second = every(1)
    assert second.slots(utc(2016, 1, 1), utc(2026, 1, 1), 3) == [
        utc(2025, 12, 31, 23, 59, 58),
        utc(2025, 12, 31, 23, 59, 59),
        utc(2026, 1, 1),
    ]
    assert len(second.slots(utc(1, 1, 1), utc(9999, 12, 31), 1000)) == 1000


def test_fractional_interval_keeps_microseconds() -> None:
    slots = every(1.5).slots(utc(2026, 1, 1), utc(2026, 1, 1, 0, 0, 3), 10)
    assert slots == [utc(2026, 1, 1) + timedelta(seconds=1.5), utc(2026, 1, 1, 0, 0, 3)]


# due(): the missed policies


@pytest.mark.parametrize(
    ("missed", "now", "expected"),
    [
        (Missed.LATEST, utc(2026, 1, 1, 0, 47), [utc(2026, 1, 1, 0, 40)]),
        (Missed.ALL, utc(2026, 1, 1, 0, 47), [utc(2026, 1, 1, 0, m) for m in (10, 20, 30, 40)]),
        (Missed.SKIP, utc(2026, 1, 1, 0, 47), []),
        (Missed.SKIP, utc(2026, 1, 1, 0, 40, 59), [utc(2026, 1, 1, 0, 40)]),
        (Missed.LATEST, utc(2026, 1, 1, 0, 9, 59), []),
        (Missed.ALL, utc(2025, 12, 31), []),  # a clock set back fires nothing
    ],
)
def test_due_by_missed_policy(missed: Missed, now: datetime, expected: list[datetime]) -> None:
    assert every(600, missed=missed).due(utc(2026, 1, 1), now) == expected


def test_all_keeps_the_most_recent_catch_up_slots() -> None:
    schedule = cron("0 * * * *", missed="all", catch_up=3)
    assert schedule.missed is Missed.ALL
    assert schedule.due(utc(2026, 1, 1), utc(2026, 1, 2, 5, 30)) == [
        utc(2026, 1, 2, 3),
        utc(2026, 1, 2, 4),
        utc(2026, 1, 2, 5),
    ]


def test_skip_grace_is_configurable() -> None:
    schedule = cron("0 * * * *", missed=Missed.SKIP, grace=timedelta(minutes=10))
    assert schedule.due(utc(2026, 1, 1), utc(2026, 1, 1, 5, 10)) == [utc(2026, 1, 1, 5)]
    assert schedule.due(utc(2026, 1, 1), utc(2026, 1, 1, 5, 10, 1)) == []


@pytest.mark.parametrize("missed", list(Missed))
def test_a_new_schedule_does_not_fire_retroactively(missed: Missed) -> None:
    schedule = every(600, missed=missed)
    assert schedule.due(None, utc(2026, 1, 1, 0, 10, 0, 1)) == []
    assert schedule.due(None, utc(2026, 1, 1, 0, 10)) == [utc(2026, 1, 1, 0, 10)]
    paris_now = datetime(2026, 1, 1, 1, 10, tzinfo=ZoneInfo("Europe/Paris"))
    assert schedule.due(None, paris_now) == [utc(2026, 1, 1, 0, 10)]


# Keys, fingerprints, descriptions


def test_key_is_the_name_and_the_utc_slot() -> None:
    schedule = cron("30 2 * * *", tz="Europe/Paris")
    slot = schedule.next_slot(utc(2026, 3, 28, 12))
    assert schedule.key(slot) == "schedule:report:2026-03-29T01:00:00Z"
    assert schedule.key(slot.astimezone(ZoneInfo("Asia/Kolkata"))) == schedule.key(slot)
    fractional = every(1.5).next_slot(utc(2026, 1, 1))
    assert every(1.5).key(fractional) == "schedule:tick:2026-01-01T00:00:01.500000Z"


def test_longest_name_gives_a_key_every_store_takes() -> None:
    schedule = Schedule(name="n" * 200, task="t", every=1.5)
    assert len(schedule.key(utc(9999, 12, 31, 23, 59, 59, 999999))) <= 255


def test_fingerprint_changes_with_the_definition_only() -> None:
    base = cron("*/5 * * * *", tz="Europe/Paris", args={"a": 1, "b": [1, 2]})
    same = Schedule(
        name="other name",
        task="send_report",
        cron="*/5  *  * * *",
        tz="Europe/Paris",
        args={"b": [1, 2], "a": 1},
    )
    assert base.fingerprint() == same.fingerprint()
    assert len(base.fingerprint()) == 16
    assert base.fingerprint() == "9f9bd94584544f9d", "stable across processes and releases"
    changed = [
        cron("*/5 * * * *", tz="Europe/Paris", args={"a": 2, "b": [1, 2]}),
        cron("*/10 * * * *", tz="Europe/Paris", args={"a": 1, "b": [1, 2]}),
        cron("*/5 * * * *", tz="Europe/London", args={"a": 1, "b": [1, 2]}),
        cron("*/5 * * * *", tz="Europe/Paris", args={"a": 1, "b": [1, 2]}, missed="all"),
        cron("*/5 * * * *", tz="Europe/Paris", args={"a": 1, "b": [1, 2]}, catch_up=11),
    ]
    assert len({base.fingerprint(), *(s.fingerprint() for s in changed)}) == 6
    assert every(600).fingerprint() == every(timedelta(minutes=10)).fingerprint()


def test_describe() -> None:
    assert cron("*/5 * * * *", tz="Europe/Paris").describe() == "cron '*/5 * * * *' in Europe/Paris"
    assert every(timedelta(minutes=10)).describe() == "every 600s"
    assert every(1.5).describe() == "every 1.5s"


# Every ConfigurationError


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cron": "* * * * *", "every": 60}, "exactly one of cron= and every="),
        ({}, "exactly one of cron= and every="),
        ({"cron": "61 * * * *"}, "schedule 'nightly': cron='61 * * * *' is not valid"),
        ({"cron": "0 0 31 2 *"}, "cron='0 0 31 2 *' is not valid"),
        ({"cron": "* * *"}, "five fields"),
        ({"cron": "0 30 2 * * *"}, "five fields"),
        ({"cron": "@daily"}, "five fields"),
        ({"cron": 5}, "five fields"),
        ({"cron": "* * * * *", "tz": "Mars/Olympus_Mons"}, "not an IANA time zone"),
        ({"cron": "* * * * *", "tz": "../../etc/passwd"}, "not an IANA time zone"),
        ({"cron": "* * * * *", "tz": ""}, "not an IANA time zone"),
        ({"every": 60, "missed": "sometimes"}, "missed must be one of 'skip', 'latest', 'all'"),
        ({"every": 60, "catch_up": 0}, "catch_up must be from 1 to 1000"),
        ({"every": 60, "catch_up": 1001}, "catch_up must be from 1 to 1000"),
        ({"every": 60, "catch_up": True}, "catch_up must be an integer"),
        ({"every": 0.5}, "every must be from 1"),
        ({"every": timedelta(milliseconds=999)}, "every must be from 1"),
        ({"every": float("nan")}, "every must be from 1"),
        ({"every": 200 * 365 * 86400}, "every must be from 1"),
        ({"every": "600"}, "every must be a number of seconds or a timedelta"),
        ({"every": 60, "grace": 0}, "grace must be from"),
        ({"every": 60, "args": [1, 2]}, "args must be a mapping"),
        ({"every": 60, "name": "n" * 201}, "name must be 1 to 200 printable characters"),
        ({"every": 60, "name": ""}, "name must be 1 to 200 printable characters"),
        ({"every": 60, "name": "a\x00b"}, "name must be 1 to 200 printable characters"),
        ({"every": 60, "task": "line\nbreak"}, "task must be 1 to 200 printable characters"),
    ],
)
def test_invalid_definitions(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message.replace("*", r"\*")):
        Schedule(**{"name": "nightly", "task": "t", **kwargs})


NAIVE = datetime(2026, 1, 1)


@pytest.mark.parametrize(
    "call",
    [
        lambda s: s.next_slot(NAIVE),
        lambda s: s.slots(NAIVE, utc(2026, 1, 2), 10),
        lambda s: s.slots(utc(2026, 1, 1), NAIVE, 10),
        lambda s: s.due(NAIVE, utc(2026, 1, 2)),
        lambda s: s.due(utc(2026, 1, 1), NAIVE),
        lambda s: s.key(NAIVE),
    ],
)
@pytest.mark.parametrize("schedule", [cron("0 * * * *"), every(60)])
def test_naive_datetimes_are_refused(call: Any, schedule: Schedule) -> None:
    with pytest.raises(ConfigurationError, match="must be an aware datetime"):
        call(schedule)


@pytest.mark.parametrize("limit", [0, -1, True, 1.5])
def test_slots_needs_a_positive_limit(limit: Any) -> None:
    with pytest.raises(ConfigurationError, match="limit of 1 or more"):
        every(60).slots(utc(2026, 1, 1), utc(2026, 1, 2), limit)


def test_no_slot_left_is_an_error() -> None:
    with pytest.raises(ConfigurationError, match="has no slot after"):
        every(86400).next_slot(utc(9999, 12, 31, 1))
    with pytest.raises(ConfigurationError, match="has no slot after"):
        cron("0 0 1 1 *").next_slot(utc(9999, 6, 1))
