"""The chaos checker on synthetic histories: one clean run, and one breach per check."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from conveyor.model import DEFAULT_RETRY, Attempt, Outcome, Task, TaskState
from tools.chaos.app import TAGGED_NAME
from tools.chaos.checker import (
    Execution,
    Expected,
    FaultEvent,
    HistoryError,
    Kind,
    NameCounts,
    Report,
    check,
    read_events,
    read_ledger,
)
from tools.chaos.wipe import check_wipe

T0 = datetime(2024, 1, 1, tzinfo=UTC)
EPOCH = T0.timestamp()
LEASE = 2.0
POLL = 0.5  # reclaim bound: 2.0 + 0.5 + 1.0 = 3.5 s


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def attempt(
    task_id: int,
    number: int,
    outcome: Outcome,
    start: float,
    end: float | None = None,
    worker: str = "w1",
) -> Attempt:
    finished = None if end is None else at(end)
    return Attempt(task_id, number, worker, outcome, at(start), finished)


def task(task_id: int, state: TaskState, *attempts: Attempt) -> Task:
    return Task(
        id=task_id,
        name="chaos_work",
        queue="default",
        payload={},
        state=state,
        priority=0,
        run_at=T0,
        attempt=len(attempts),
        max_attempts=50,
        retry=DEFAULT_RETRY,
        timeout=None,
        lease=None,
        result=None,
        created_at=T0,
        finished_at=None,
        worker_id=None,
        lease_expires_at=None,
        cancel_requested=False,
        attempts=attempts,
    )


PIDS = {"w1": 101, "w2": 102, "w3": 103}


def ran(
    task_id: int, number: int, start: float, end: float | None, worker: str = "w1"
) -> list[str]:
    """Ledger lines of one execution (no ``end`` line when ``end`` is None)."""
    lines = [_line("start", task_id, number, worker, start)]
    if end is not None:
        lines.append(_line("end", task_id, number, worker, end))
    return lines


def _line(event: str, task_id: int, number: int, worker: str, seconds: float) -> str:
    record = {
        "event": event,
        "task": task_id,
        "attempt": number,
        "worker": worker,
        "pid": PIDS[worker],
        "at": EPOCH + seconds,
    }
    return json.dumps(record)


def fault(event: str, worker: str, seconds: float) -> str:
    return json.dumps({"event": event, "pid": PIDS[worker], "at": EPOCH + seconds})


SPAWNS = [fault("spawn", "w1", -1.0), fault("spawn", "w2", -1.0)]


def run(
    tasks: Iterable[Task],
    ledger: Iterable[str] = (),
    faults: Sequence[str] = (),
    *,
    enqueued: Sequence[int] | None = None,
    control: bool = False,
    expected: dict[int, Expected] | None = None,
    chords: Sequence[tuple[Sequence[int], int]] = (),
) -> Report:
    by_id = {t.id: t for t in tasks}
    return check(
        tasks=by_id,
        enqueued=list(by_id) if enqueued is None else enqueued,
        ledger=read_ledger(ledger),
        faults=read_events([*SPAWNS, *faults]),
        lease=LEASE,
        poll_interval=POLL,
        control=control,
        expected=expected,
        chords=chords,
    )


def kinds(report: Report) -> set[Kind]:
    return {v.kind for v in report.violations}


def succeeded_once(task_id: int) -> tuple[Task, list[str]]:
    return (
        task(task_id, TaskState.SUCCEEDED, attempt(task_id, 1, Outcome.SUCCEEDED, 0.0, 0.2)),
        ran(task_id, 1, 0.05, 0.15),
    )


# -- a clean run ---------------------------------------------------------------


def clean_history() -> tuple[list[Task], list[str], list[str]]:
    one, one_ledger = succeeded_once(1)
    # Task 2: w1 is killed while running it; w2 reclaims it 2.2 s later.
    two = task(
        2,
        TaskState.SUCCEEDED,
        attempt(2, 1, Outcome.LEASE_LOST, 0.4, 3.2, worker="w1"),
        attempt(2, 2, Outcome.SUCCEEDED, 3.2, 3.5, worker="w2"),
    )
    two_ledger = ran(2, 1, 0.5, None) + ran(2, 2, 3.25, 3.4, worker="w2")
    # Task 3: fails once, succeeds on its retry.
    three = task(
        3,
        TaskState.SUCCEEDED,
        attempt(3, 1, Outcome.FAILED, 0.0, 0.1, worker="w2"),
        attempt(3, 2, Outcome.SUCCEEDED, 0.3, 0.4, worker="w2"),
    )
    three_ledger = ran(3, 1, 0.01, 0.09, "w2") + ran(3, 2, 0.31, 0.39, "w2")
    four = task(4, TaskState.CANCELLED)  # cancelled before it ever ran
    faults = [fault("kill", "w1", 1.0), fault("spawn", "w3", 1.1)]
    return [one, two, three, four], one_ledger + two_ledger + three_ledger, faults


def test_clean_history_passes_with_its_counts() -> None:
    tasks, ledger, faults = clean_history()
    report = run(tasks, ledger, faults)
    assert report.ok, report.summary()
    assert report.violations == ()
    assert (report.enqueued, report.terminal, report.lost) == (4, 4, 0)
    assert (report.succeeded, report.failed, report.cancelled) == (3, 0, 1)
    assert report.duplicates == 2  # tasks 2 and 3 ran twice
    assert report.duplicates_explained == 0  # their executions never overlapped
    assert (report.stale_writes_rejected, report.stale_writes_accepted) == (0, 0)
    assert report.reclaims == 1
    assert report.worst_reclaim_seconds == pytest.approx(2.2)
    assert report.worker_restarts == 1  # two spawns before the first fault
    assert report.names == {
        "chaos_work": NameCounts(tasks=4, attempts=5, lease_lost=1, killed_in_body=1)
    }


def test_report_serialises_and_summarises() -> None:
    tasks, ledger, faults = clean_history()
    data = run(tasks, ledger, faults).to_json()
    assert json.loads(json.dumps(data)) == data
    assert data["ok"] is True
    assert data["violations"] == []

    lost = run([], enqueued=list(range(1, 41)))
    text = lost.summary()
    assert text.startswith("chaos check: FAILED (40 violations)")
    assert "... and 25 more" in text
    assert len(text.splitlines()) <= 25
    assert lost.to_json()["violations"][0] == {
        "kind": "lost",
        "task_id": 1,
        "detail": "acknowledged but missing from the store",
    }


# -- one breach per check --------------------------------------------------------


def test_lost_missing_or_not_terminal() -> None:
    pending = task(1, TaskState.PENDING, attempt(1, 1, Outcome.FAILED, 0.0, 0.1))
    report = run([pending], ran(1, 1, 0.01, 0.05), enqueued=[1, 2])
    assert kinds(report) == {Kind.LOST}
    assert [v.task_id for v in report.violations] == [1, 2]
    assert (report.enqueued, report.terminal, report.lost) == (2, 0, 2)


def test_unacknowledged_task_is_not_lost() -> None:
    pending = task(1, TaskState.PENDING)
    assert run([pending], enqueued=[]).ok


def test_double_success_two_succeeded_attempts() -> None:
    twice = task(
        1,
        TaskState.SUCCEEDED,
        attempt(1, 1, Outcome.SUCCEEDED, 0.0, 0.1),
        attempt(1, 2, Outcome.SUCCEEDED, 5.0, 5.2, worker="w2"),
    )
    ledger = ran(1, 1, 0.01, 0.05) + ran(1, 2, 5.05, 5.1, "w2")
    report = run([twice], ledger)
    assert kinds(report) == {Kind.DOUBLE_SUCCESS}
    assert len(report.violations) == 1


def test_double_success_succeeded_attempt_not_last() -> None:
    again = task(
        1,
        TaskState.FAILED,
        attempt(1, 1, Outcome.SUCCEEDED, 0.0, 0.1),
        attempt(1, 2, Outcome.FAILED, 5.0, 5.2, worker="w2"),
    )
    report = run([again], ran(1, 1, 0.01, 0.05) + ran(1, 2, 5.05, 5.1, "w2"))
    assert kinds(report) == {Kind.DOUBLE_SUCCESS}
    assert "then attempt 2 ran" in report.violations[0].detail


@pytest.mark.parametrize(
    ("state", "attempts", "needle"),
    [
        pytest.param(
            TaskState.SUCCEEDED,
            [(1, Outcome.FAILED), (3, Outcome.SUCCEEDED)],
            "numbers are [1, 3]",
            id="gap",
        ),
        pytest.param(
            TaskState.IN_PROGRESS,
            [(1, Outcome.IN_PROGRESS), (2, Outcome.IN_PROGRESS)],
            "all in_progress",
            id="two-in-progress",
        ),
        pytest.param(
            TaskState.PENDING,
            [(1, Outcome.IN_PROGRESS), (2, Outcome.FAILED)],
            "attempt 2 followed",
            id="in-progress-not-last",
        ),
        pytest.param(
            TaskState.CANCELLED,
            [(1, Outcome.IN_PROGRESS)],
            "task cancelled, but attempt 1 is in_progress",
            id="in-progress-on-terminal",
        ),
    ],
)
def test_attempt_numbers(
    state: TaskState, attempts: list[tuple[int, Outcome]], needle: str
) -> None:
    rows = [
        attempt(1, n, o, 10.0 * n, None if o is Outcome.IN_PROGRESS else 10.0 * n + 1)
        for n, o in attempts
    ]
    ledger = [line for n, _ in attempts for line in ran(1, n, 10.0 * n + 0.1, 10.0 * n + 0.5)]
    report = run([task(1, state, *rows)], ledger, enqueued=[])
    assert kinds(report) == {Kind.ATTEMPT_NUMBERS}
    assert any(needle in v.detail for v in report.violations), report.summary()


def test_stale_write_accepted_handler_ended_after_the_next_claim() -> None:
    # w1 lost its lease (attempt 2 claimed at 4.0), finished at 5.0, and its
    # success was still recorded: the fence let a stale write through.
    stale = task(
        1,
        TaskState.SUCCEEDED,
        attempt(1, 1, Outcome.SUCCEEDED, 0.0, 5.1),
        attempt(1, 2, Outcome.INTERRUPTED, 4.0, 4.5, worker="w2"),
    )
    report = run([stale], ran(1, 1, 0.1, 5.0))
    assert kinds(report) == {Kind.STALE_WRITE_ACCEPTED}
    details = [v.detail for v in report.violations]
    assert any("handler ended 1.000s after attempt 2 started" in d for d in details)
    assert any("last attempt 2 ended interrupted" in d for d in details)
    assert report.stale_writes_accepted == 2


def test_a_handler_end_within_the_store_clock_s_resolution_is_not_a_late_write() -> None:
    # A workflow's step committed and the next step was claimed 0.3 ms after
    # the handler's end; SQLite's millisecond clock stamped the claim 0.4 ms
    # before it. 5 ms would be a late write.
    def check_end(end: float) -> Report:
        history = flow(
            1,
            TaskState.SUCCEEDED,
            attempt(1, 1, Outcome.SUCCEEDED, 0.0, 4.0),
            attempt(1, 2, Outcome.SUCCEEDED, 4.0, 6.0, worker="w2"),
        )
        ledger = step_ran(1, 1, 0, 0.1, end) + step_ran(1, 2, 1, 4.1, 5.9, worker="w2")
        return run([history], ledger)

    assert not check_end(4.0004).violations
    late = check_end(4.005).violations
    assert [v.kind for v in late] == [Kind.STALE_WRITE_ACCEPTED]
    assert "handler ended 0.005s after attempt 2 started" in late[0].detail


def test_stale_write_accepted_recorded_after_the_next_claim() -> None:
    stale = task(
        1,
        TaskState.FAILED,
        attempt(1, 1, Outcome.SUCCEEDED, 0.0, 4.5),
        attempt(1, 2, Outcome.FAILED, 4.0, 4.8, worker="w2"),
    )
    report = run([stale])
    assert kinds(report) == {Kind.STALE_WRITE_ACCEPTED}
    assert "recorded 0.500s after attempt 2 started" in report.violations[0].detail


def test_stale_write_accepted_task_succeeded_by_a_lost_lease() -> None:
    stale = task(1, TaskState.SUCCEEDED, attempt(1, 1, Outcome.LEASE_LOST, 0.0, 3.0))
    report = run([stale], ran(1, 1, 0.1, 3.5))
    assert kinds(report) == {Kind.STALE_WRITE_ACCEPTED}
    assert report.stale_writes_rejected == 1  # the attempt row itself was fenced


def test_overlapping_leases() -> None:
    # Attempt 1 timed out at 1.0 but its handler ran on until 3.0, across attempt 2.
    overlap = task(
        1,
        TaskState.SUCCEEDED,
        attempt(1, 1, Outcome.TIMED_OUT, 0.0, 1.0),
        attempt(1, 2, Outcome.SUCCEEDED, 1.5, 2.1, worker="w2"),
    )
    report = run([overlap], ran(1, 1, 0.1, 3.0) + ran(1, 2, 1.6, 2.0, "w2"))
    assert kinds(report) == {Kind.OVERLAPPING_LEASES}
    assert (
        report.violations[0].detail == "attempt 2 ran while attempt 1 (timed_out) was still running"
    )
    assert report.duplicates_explained == 0


def test_a_kill_ends_an_execution_without_an_end() -> None:
    # Attempt 1 never wrote "end": its process died at 1.0, before attempt 2
    # began, though the attempt row was only closed at 2.0.
    killed = task(
        1,
        TaskState.SUCCEEDED,
        attempt(1, 1, Outcome.INTERRUPTED, 0.0, 2.0),
        attempt(1, 2, Outcome.SUCCEEDED, 1.4, 2.1, worker="w2"),
    )
    ledger = ran(1, 1, 0.1, None) + ran(1, 2, 1.5, 2.0, "w2")
    assert run([killed], ledger, [fault("kill", "w1", 1.0)]).ok
    report = run([killed], ledger)  # no kill: it ran until its row was closed
    assert kinds(report) == {Kind.OVERLAPPING_LEASES}


def test_explained_zombie_overlap_after_lease_lost() -> None:
    # w1 is stopped for longer than its lease, w2 reclaims and finishes the
    # task; w1 wakes, ends its handler, and its completion is refused.
    zombie = task(
        1,
        TaskState.SUCCEEDED,
        attempt(1, 1, Outcome.LEASE_LOST, 0.0, 3.3),
        attempt(1, 2, Outcome.SUCCEEDED, 3.3, 3.7, worker="w2"),
    )
    ledger = ran(1, 1, 0.5, 6.1) + ran(1, 2, 3.4, 3.6, "w2")
    faults = [fault("stop", "w1", 1.0), fault("cont", "w1", 6.0)]
    report = run([zombie], ledger, faults)
    assert report.ok, report.summary()
    assert (report.duplicates, report.duplicates_explained) == (1, 1)
    assert report.stale_writes_rejected == 1
    assert report.reclaims == 1
    assert report.worst_reclaim_seconds == pytest.approx(2.3)
    assert report.handlers_stopped == 0


def test_a_handler_stopped_after_its_lease_was_lost_is_counted() -> None:
    # As above, but w1's worker stops the handler when it wakes: no ``end``.
    zombie = task(
        1,
        TaskState.SUCCEEDED,
        attempt(1, 1, Outcome.LEASE_LOST, 0.0, 3.3),
        attempt(1, 2, Outcome.SUCCEEDED, 3.3, 3.7, worker="w2"),
    )
    ledger = ran(1, 1, 0.5, None) + ran(1, 2, 3.4, 3.6, "w2")
    stopped = [fault("stop", "w1", 1.0), fault("cont", "w1", 6.0)]
    report = run([zombie], ledger, stopped)
    assert report.ok, report.summary()
    assert (report.handlers_stopped, report.stale_writes_rejected) == (1, 0)
    # A killed process's handler did not stop: it died.
    assert run([zombie], ledger, [fault("kill", "w1", 1.0)]).handlers_stopped == 0


@pytest.mark.parametrize(
    ("attempts", "ledger", "needle"),
    [
        pytest.param(
            [(1, Outcome.SUCCEEDED, "w1")],
            ran(1, 1, 0.1, 0.2) + ran(1, 1, 0.3, 0.4, "w2"),
            "attempt 1 executed 2 times",
            id="same-attempt-twice",
        ),
        pytest.param(
            [(1, Outcome.SUCCEEDED, "w1")],
            ran(1, 1, 0.1, 0.2) + ran(1, 2, 0.3, 0.4, "w2"),
            "attempt 2 executed, but there is no such attempt",
            id="no-attempt-row",
        ),
        pytest.param(
            [(1, Outcome.CANCELLED, "w1"), (2, Outcome.SUCCEEDED, "w2")],
            ran(1, 1, 0.1, None) + ran(1, 2, 10.1, 10.2, "w2"),
            "attempt 2 ran after attempt 1 was cancelled",
            id="after-cancelled",
        ),
    ],
)
def test_unexplained_duplicate(
    attempts: list[tuple[int, Outcome, str]], ledger: list[str], needle: str
) -> None:
    rows = [attempt(1, n, o, 10.0 * (n - 1), 10.0 * (n - 1) + 1, w) for n, o, w in attempts]
    report = run([task(1, TaskState.SUCCEEDED, *rows)], ledger)
    assert kinds(report) == {Kind.UNEXPLAINED_DUPLICATE}
    assert [v.detail for v in report.violations] == [needle]


@pytest.mark.parametrize(
    "outcome", [Outcome.LEASE_LOST, Outcome.INTERRUPTED, Outcome.TIMED_OUT, Outcome.FAILED]
)
def test_a_later_attempt_is_expected_after(outcome: Outcome) -> None:
    retried = task(
        1,
        TaskState.SUCCEEDED,
        attempt(1, 1, outcome, 0.0, 1.0),
        attempt(1, 2, Outcome.SUCCEEDED, 2.0, 2.5, worker="w2"),
    )
    assert run([retried], ran(1, 1, 0.1, None) + ran(1, 2, 2.1, 2.4, "w2")).ok


def test_control_duplicate() -> None:
    tasks, ledger, _faults = clean_history()
    report = run(tasks, ledger, control=True)
    assert kinds(report) == {Kind.CONTROL_DUPLICATE}
    assert [v.task_id for v in report.violations] == [2, 3]
    once, once_ledger = succeeded_once(1)
    assert run([once], once_ledger, control=True).ok


# -- reclaim latency -----------------------------------------------------------


def reclaimed(after: float) -> tuple[Task, list[str]]:
    """Task 1: attempt 1 on w1 from 0.0, lost, reclaimed by w2 at ``after``."""
    t = task(
        1,
        TaskState.SUCCEEDED,
        attempt(1, 1, Outcome.LEASE_LOST, 0.0, after),
        attempt(1, 2, Outcome.SUCCEEDED, after, after + 0.2, worker="w2"),
    )
    return t, ran(1, 1, 0.1, None) + ran(1, 2, after + 0.05, after + 0.1, "w2")


def test_reclaim_within_the_bound() -> None:
    t, ledger = reclaimed(4.4)
    report = run([t], ledger, [fault("kill", "w1", 1.0)])
    assert report.ok, report.summary()
    assert report.worst_reclaim_seconds == pytest.approx(3.4)


def test_slow_reclaim_over_the_bound() -> None:
    t, ledger = reclaimed(4.6)
    report = run([t], ledger, [fault("kill", "w1", 1.0)])
    assert kinds(report) == {Kind.SLOW_RECLAIM}
    assert report.worst_reclaim_seconds == pytest.approx(3.6)
    assert "pid 101 (w1) reclaimed 3.60s after its worker died (bound 3.50s)" in str(
        report.violations[0]
    )


def test_a_short_stop_is_not_a_death() -> None:
    t, ledger = reclaimed(9.0)  # lost for some other reason, reclaimed late
    short = [fault("stop", "w1", 1.0), fault("cont", "w1", 2.5)]  # 1.5 s < lease
    report = run([t], ledger, short)
    assert report.ok
    assert (report.reclaims, report.worst_reclaim_seconds) == (0, None)


@pytest.mark.parametrize(
    "faults",
    [
        pytest.param([fault("stop", "w1", 1.0)], id="never-continued"),
        pytest.param([fault("stop", "w1", 1.0), fault("cont", "w1", 3.5)], id="continued-late"),
    ],
)
def test_a_long_stop_is_a_death(faults: list[str]) -> None:
    t, ledger = reclaimed(5.0)
    report = run([t], ledger, faults)
    assert kinds(report) == {Kind.SLOW_RECLAIM}
    assert report.worst_reclaim_seconds == pytest.approx(4.0)


def test_worker_restarts_explicit_or_inferred() -> None:
    events = read_events(
        [*SPAWNS, fault("kill", "w1", 1.0), fault("spawn", "w3", 1.1), fault("term", "w2", 9.0)]
    )

    def restarts(initial: int | None) -> int:
        report = check(
            tasks={},
            enqueued=[],
            ledger=[],
            faults=events,
            lease=LEASE,
            poll_interval=POLL,
            initial_workers=initial,
        )
        return report.worker_restarts

    assert restarts(None) == 1  # two spawns before the first fault
    assert restarts(1) == 2


def test_a_worker_hung_after_sigterm_is_a_violation() -> None:
    t, ledger = succeeded_once(1)
    report = run([t], ledger, [fault("term", "w1", 1.0), fault("hung", "w1", 40.0)])
    assert kinds(report) == {Kind.HUNG_WORKER}
    assert f"pid {PIDS['w1']}" in report.violations[0].detail


# -- reading the files -------------------------------------------------------------


def test_ledger_tolerates_blank_lines_and_a_torn_last_line() -> None:
    lines = [*ran(1, 1, 0.1, 0.2), "", "   ", '{"event": "start", "task": 2, "att']
    assert read_ledger(lines) == [
        Execution("start", 1, 1, "w1", 101, EPOCH + 0.1),
        Execution("end", 1, 1, "w1", 101, EPOCH + 0.2),
    ]
    assert read_ledger([*ran(1, 1, 0.1, None), ""]) == [
        Execution("start", 1, 1, "w1", 101, EPOCH + 0.1)
    ]
    assert read_events([fault("kill", "w1", 1.0), '{"event": "sp']) == [
        FaultEvent("kill", 101, EPOCH + 1.0)
    ]


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param('{"event": "sta', id="torn-in-the-middle"),
        pytest.param("[1, 2]", id="not-an-object"),
        pytest.param(_line("finish", 1, 1, "w1", 0.0), id="unknown-event"),
        pytest.param(
            '{"event": "start", "task": "1", "attempt": 1, "worker": "w", "pid": 1, "at": 0}',
            id="string-id",
        ),
        pytest.param('{"event": "end", "task": 1, "attempt": 1, "pid": 1, "at": 0}', id="missing"),
    ],
)
def test_ledger_rejects_a_malformed_line(bad: str) -> None:
    with pytest.raises(HistoryError, match="line 2"):
        read_ledger([ran(1, 1, 0.1, None)[0], bad, ran(1, 1, 0.1, 0.2)[1]])


def test_a_sqlite_stop_counts_from_its_continue_minus_a_lease() -> None:
    """A process frozen while holding SQLite's write lock freezes every
    worker: its tasks can only be reclaimed once it continues (4 s here)."""
    history = task(
        1,
        TaskState.SUCCEEDED,
        attempt(1, 1, Outcome.LEASE_LOST, -0.5, 4.2, worker="w1"),
        attempt(1, 2, Outcome.SUCCEEDED, 4.3, 4.4, worker="w2"),
    )
    ledger = read_ledger([*ran(1, 1, -0.5, 4.1, "w1"), *ran(1, 2, 4.3, 4.35, "w2")])
    faults = read_events([*SPAWNS, fault("stop", "w1", 0.0), fault("cont", "w1", 4.0)])
    common = {
        "tasks": {1: history},
        "enqueued": [1],
        "ledger": ledger,
        "faults": faults,
        "lease": LEASE,
        "poll_interval": POLL,
    }
    many_writers = check(**common)  # type: ignore[arg-type]
    assert [v.kind for v in many_writers.violations] == [Kind.SLOW_RECLAIM]
    one_writer = check(**common, single_writer=True)  # type: ignore[arg-type]
    assert one_writer.ok, one_writer.summary()
    assert one_writer.worst_reclaim_seconds == pytest.approx(2.3)


# -- workflows and coroutines: one attempt per step or poll -------------------------


def flow(task_id: int, state: TaskState, *attempts: Attempt, result: object = None) -> Task:
    """A step workflow (``step`` set): each attempt runs one step."""
    return replace(task(task_id, state, *attempts), step="Hop", result=result)


def step_ran(
    task_id: int, number: int, seq: int, start: float, end: float | None, worker: str = "w1"
) -> list[str]:
    """Ledger lines of one step's execution, with its ``seq``."""
    lines = ran(task_id, number, start, end, worker)
    return [json.dumps({**json.loads(line), "seq": seq}) for line in lines]


def committed_flow() -> tuple[Task, list[str]]:
    """Three steps; the worker running step 1 dies and step 1 runs again."""
    t = flow(
        1,
        TaskState.SUCCEEDED,
        attempt(1, 1, Outcome.SUCCEEDED, 0.0, 0.2),
        attempt(1, 2, Outcome.LEASE_LOST, 0.3, 3.0),
        attempt(1, 3, Outcome.SUCCEEDED, 3.0, 3.3, worker="w2"),
        attempt(1, 4, Outcome.SUCCEEDED, 3.4, 3.6, worker="w2"),
        result=[0, 1, 2],
    )
    ledger = (
        step_ran(1, 1, 0, 0.05, 0.15)
        + step_ran(1, 2, 1, 0.35, None)
        + step_ran(1, 3, 1, 3.05, 3.25, "w2")
        + step_ran(1, 4, 2, 3.45, 3.55, "w2")
    )
    return t, ledger


def test_a_workflow_that_reran_an_uncommitted_step_is_clean() -> None:
    t, ledger = committed_flow()
    report = run([t], ledger, [fault("kill", "w1", 0.5)], expected={1: Expected([0, 1, 2])})
    assert report.ok, report.summary()
    assert report.duplicates == 1  # step 1 ran twice
    assert report.reclaims == 1


def test_a_step_run_again_after_its_transition_committed_is_a_rerun() -> None:
    t = flow(
        1,
        TaskState.SUCCEEDED,
        attempt(1, 1, Outcome.SUCCEEDED, 0.0, 0.2),
        attempt(1, 2, Outcome.SUCCEEDED, 0.3, 0.5),
        result=[0, 1],
    )
    # Attempt 2 ran step 0 again though attempt 1 had committed it.
    ledger = step_ran(1, 1, 0, 0.05, 0.15) + step_ran(1, 2, 0, 0.35, 0.45)
    report = run([t], ledger)
    assert kinds(report) == {Kind.STEP_RERUN, Kind.DOUBLE_SUCCESS}
    rerun = next(v for v in report.violations if v.kind is Kind.STEP_RERUN)
    assert rerun.detail == "step 0 ran again in attempt 2 after attempt 1 committed it"


def test_a_step_committed_by_two_attempts_is_a_double_success() -> None:
    t = flow(
        1,
        TaskState.SUCCEEDED,
        attempt(1, 1, Outcome.SUCCEEDED, 0.0, 0.2),
        attempt(1, 2, Outcome.SUCCEEDED, 0.1, 0.3, worker="w2"),
    )
    ledger = step_ran(1, 1, 0, 0.05, 0.15) + step_ran(1, 2, 0, 0.12, 0.25, "w2")
    report = run([t], ledger)
    assert Kind.DOUBLE_SUCCESS in kinds(report)
    assert any(v.detail == "attempts 1 and 2 both committed step 0" for v in report.violations)


def test_a_late_step_commit_is_a_stale_write() -> None:
    t = flow(
        1,
        TaskState.SUCCEEDED,
        attempt(1, 1, Outcome.SUCCEEDED, 0.0, 3.5),
        attempt(1, 2, Outcome.SUCCEEDED, 3.0, 3.2, worker="w2"),
    )
    ledger = step_ran(1, 1, 0, 0.05, 3.4) + step_ran(1, 2, 1, 3.05, 3.1, "w2")
    assert Kind.STALE_WRITE_ACCEPTED in kinds(run([t], ledger))


def test_control_run_allows_one_committed_attempt_per_step_only() -> None:
    three = flow(
        1,
        TaskState.SUCCEEDED,
        *(attempt(1, n, Outcome.SUCCEEDED, n, n + 0.2) for n in (1, 2, 3)),
    )
    ledger = [line for n in (1, 2, 3) for line in step_ran(1, n, n - 1, n + 0.05, n + 0.1)]
    assert run([three], ledger, control=True).ok

    retried = flow(
        2,
        TaskState.SUCCEEDED,
        attempt(2, 1, Outcome.FAILED, 0.0, 0.2),
        attempt(2, 2, Outcome.SUCCEEDED, 0.3, 0.5),
    )
    ledger = step_ran(2, 1, 0, 0.05, 0.1) + step_ran(2, 2, 0, 0.35, 0.4)
    report = run([retried], ledger, control=True)
    assert kinds(report) == {Kind.CONTROL_DUPLICATE}


def test_a_result_other_than_expected_is_wrong() -> None:
    one, ledger = succeeded_once(1)
    one = replace(one, result=7)
    assert run([one], ledger, expected={1: Expected(7)}).ok
    report = run([one], ledger, expected={1: Expected(8)})
    assert kinds(report) == {Kind.WRONG_RESULT}
    assert report.violations[0].detail == "result 7, expected 8"


def gathered(result: object) -> Task:
    t = task(1, TaskState.SUCCEEDED, attempt(1, 1, Outcome.SUCCEEDED, 0.0, 0.2))
    return replace(t, inbox=True, result=result)


def test_each_message_must_be_consumed_exactly_once() -> None:
    ledger = step_ran(1, 1, 0, 0.05, 0.15)
    want = Expected(messages=("child:0", "child:1", "m0", "last"), maybe=("m1", "last"))
    ok = gathered(["child:0", "child:1", "last", "last", "m0"])  # "last" sent twice
    assert run([ok], ledger, expected={1: want}).ok

    report = run(
        [gathered(["child:0", "last", "m0", "m0", "m1", "m1"])], ledger, expected={1: want}
    )
    assert sorted((v.kind, v.detail) for v in report.violations) == [
        (Kind.MESSAGE_LOST, "message 'child:1' consumed 0 times, sent 1"),
        (Kind.MESSAGE_TWICE, "message 'm0' consumed 2 times, sent 1 (+0 unknown)"),
        (Kind.MESSAGE_TWICE, "message 'm1' consumed 2 times, sent 0 (+1 unknown)"),
    ]

    report = run([gathered(["child:0", "child:1", "m0", "last", "m9"])], ledger, expected={1: want})
    assert [(v.kind, v.detail) for v in report.violations] == [
        (Kind.WRONG_RESULT, "unexpected message 'm9'")
    ]
    report = run([gathered({"not": "a list"})], ledger, expected={1: want})
    assert kinds(report) == {Kind.WRONG_RESULT}


def test_results_of_tasks_that_did_not_succeed_are_not_checked() -> None:
    failed = task(1, TaskState.FAILED, attempt(1, 1, Outcome.FAILED, 0.0, 0.2))
    report = run([failed], ran(1, 1, 0.05, 0.1), expected={1: Expected(messages=("m0",))})
    assert report.ok and report.failed == 1


def test_ledger_seq_is_read_and_checked() -> None:
    [start] = read_ledger(step_ran(1, 1, 4, 0.0, None))
    assert start.seq == 4
    assert read_ledger(ran(1, 1, 0.0, None))[0].seq == 0
    with pytest.raises(HistoryError, match="seq"):
        read_ledger([json.dumps({**json.loads(ran(1, 1, 0.0, None)[0]), "seq": "x"}), "{}"])


def test_where_a_kill_caught_each_execution_is_counted() -> None:
    t, ledger = committed_flow()  # w1 ran steps 0 and 1; step 1 never ended
    # Killed after step 1's body ended, before its completion was recorded.
    ledger = [line for line in ledger if '"attempt": 2' not in line]
    ledger += step_ran(1, 2, 1, 0.35, 0.45)
    report = run([t], ledger, [fault("kill", "w1", 0.5)], expected={1: Expected([0, 1, 2])})
    assert report.ok, report.summary()
    assert report.names["chaos_work"] == NameCounts(
        tasks=1, attempts=4, lease_lost=1, killed_in_body=0, killed_before_commit=1
    )
    assert "killed 0 in the body, 1 after it and before the commit" in report.summary()
    # The same kill while step 1 still ran.
    t, ledger = committed_flow()
    counts = run([t], ledger, [fault("kill", "w1", 0.5)]).names["chaos_work"]
    assert (counts.killed_in_body, counts.killed_before_commit) == (1, 0)
    assert run([t], ledger).names["chaos_work"].killed_in_body == 0


def test_a_schedule_slot_twice_or_missing_is_a_violation() -> None:
    def tick(task_id: int, second: int) -> Task:
        return replace(
            task(task_id, TaskState.SUCCEEDED),
            name="chaos_tick",
            idempotency_key=f"schedule:chaos_tick:2030-01-01T00:00:{second:02d}",
        )

    def slots(ticks: list[Task]) -> list[tuple[int | None, str]]:
        report = check(
            tasks={t.id: t for t in ticks},
            enqueued=[],
            ledger=[],
            faults=[],
            lease=LEASE,
            poll_interval=POLL,
            ticks=ticks,
        )
        return [(v.task_id, v.detail) for v in report.violations if v.kind is Kind.SCHEDULE_SLOT]

    assert slots([tick(1, 0), tick(2, 1), tick(3, 2)]) == []
    assert [v[0] for v in slots([tick(1, 0), tick(2, 0), tick(3, 1)])] == [2]
    [(missing, detail)] = slots([tick(1, 0), tick(2, 1), tick(3, 4)])
    assert missing == 3 and "3s" in detail


def test_a_unique_key_held_twice_or_answered_wrong_is_a_violation() -> None:
    def raced(task_id: int, k: int) -> Task:
        return replace(task(task_id, TaskState.SUCCEEDED), name="chaos_race", payload={"k": k})

    def breaches(races: list[Task], answers: list[dict[int, int] | None]) -> list[int | None]:
        report = check(
            tasks={t.id: t for t in races},
            enqueued=[],
            ledger=[],
            faults=[],
            lease=LEASE,
            poll_interval=POLL,
            races=races,
            race_answers=answers,
            race_keys=2,
        )
        return [v.task_id for v in report.violations if v.kind is Kind.UNIQUE_KEY]

    stored = [raced(1, 0), raced(2, 1)]
    agreed = {0: 1, 1: 2}
    assert breaches(stored, [agreed, agreed]) == []
    assert breaches([*stored, raced(3, 1)], [agreed, agreed]) == [3]  # key 1 held twice
    assert breaches(stored, [agreed, {0: 1, 1: 7}]) == [7]  # answered a task not stored
    assert breaches(stored, [agreed, {0: 1}]) == [None]  # a key left unanswered
    assert breaches(stored, [agreed, None]) == [None]  # a racer that failed


# -- chords ---------------------------------------------------------------------

CHORD = ([1, 2], 3)
"""Members 1 and 2 (returning 0 and 1), callback 3."""


def member(task_id: int, state: TaskState, *attempts: Attempt) -> Task:
    return replace(task(task_id, state, *attempts), result=task_id - 1)


def collect(state: TaskState, *attempts: Attempt, result: list[int] | None = None) -> Task:
    """Callback 3; a succeeded one returns ``[0, 1]`` unless told otherwise."""
    if result is None and state is TaskState.SUCCEEDED:
        result = [0, 1]
    return replace(task(3, state, *attempts), name="chaos_collect", result=result)


def chord_history() -> tuple[list[Task], list[str], list[str]]:
    """A chord under faults, clean: member 2's first worker was stopped past
    its lease and its late end came after the callback started (its
    completion refused); the callback's first worker was killed."""
    one = member(1, TaskState.SUCCEEDED, attempt(1, 1, Outcome.SUCCEEDED, 0.0, 0.2))
    two = member(
        2,
        TaskState.SUCCEEDED,
        attempt(2, 1, Outcome.LEASE_LOST, 0.0, 3.0, worker="w1"),
        attempt(2, 2, Outcome.SUCCEEDED, 3.0, 3.3, worker="w2"),
    )
    callback = collect(
        TaskState.SUCCEEDED,
        attempt(3, 1, Outcome.LEASE_LOST, 3.4, 6.0, worker="w3"),
        attempt(3, 2, Outcome.SUCCEEDED, 6.0, 6.2, worker="w2"),
    )
    ledger = ran(1, 1, 0.05, 0.15) + ran(2, 1, 0.05, 7.0) + ran(2, 2, 3.05, 3.2, "w2")
    ledger += ran(3, 1, 3.45, None, "w3") + ran(3, 2, 6.05, 6.1, "w2")
    faults = [fault("stop", "w1", 0.1), fault("cont", "w1", 6.9), fault("kill", "w3", 3.5)]
    return [one, two, callback], ledger, faults


def test_a_chord_released_by_its_last_member_s_end_is_clean() -> None:
    tasks, ledger, faults = chord_history()
    report = run(tasks, ledger, faults, chords=[CHORD], expected={3: Expected([0, 1])})
    assert report.ok, report.summary()
    assert report.names["chaos_collect"].tasks == 1


def breaches(
    tasks: list[Task], ledger: list[str], faults: list[str]
) -> list[tuple[Kind, int | None, str]]:
    report = run(tasks, ledger, faults, chords=[CHORD])
    return [
        (v.kind, v.task_id, v.detail)
        for v in report.violations
        if v.kind in (Kind.CHORD, Kind.EARLY_CALLBACK)
    ]


def test_a_callback_released_before_a_member_ended_is_early() -> None:
    tasks, ledger, faults = chord_history()
    # Member 2's second attempt ended after the callback's first start.
    ledger = [line for line in ledger if not ('"task": 2' in line and '"attempt": 2' in line)]
    ledger += ran(2, 2, 3.05, 3.5, "w2")
    [(kind, task_id, detail)] = breaches(tasks, ledger, faults)
    assert (kind, task_id) == (Kind.EARLY_CALLBACK, 3)
    assert detail.startswith("the callback started before member 2 attempt 2 ended")
    # Without an end line, a member's execution lasts until its attempt was recorded.
    ledger = [line for line in ledger if not ('"task": 2' in line and '"attempt": 2' in line)]
    ledger += ran(2, 2, 3.05, None, "w2")
    assert breaches(tasks, ledger, faults) == []
    late = replace(
        tasks[1], attempts=(tasks[1].attempts[0], attempt(2, 2, Outcome.SUCCEEDED, 3.0, 3.6))
    )
    [(kind, _, detail)] = breaches([tasks[0], late, tasks[2]], ledger, faults)
    assert kind is Kind.EARLY_CALLBACK and detail.endswith(
        "(it ended 0.150s after the callback started)"
    )


def test_a_member_started_again_after_its_callback_is_early() -> None:
    tasks, ledger, faults = chord_history()
    one = member(
        1,
        TaskState.SUCCEEDED,
        attempt(1, 1, Outcome.FAILED, 0.0, 0.2),
        attempt(1, 2, Outcome.SUCCEEDED, 4.0, 4.2),
    )
    ledger = [*ledger, *ran(1, 2, 4.05, 4.1)]
    [(kind, task_id, detail)] = breaches([one, *tasks[1:]], ledger, faults)
    assert (kind, task_id) == (Kind.EARLY_CALLBACK, 3)
    assert detail == "member 1 attempt 2 started 0.600s after the callback started"


def test_a_callback_that_ran_twice_is_a_breach() -> None:
    tasks, ledger, faults = chord_history()
    twice = collect(
        TaskState.SUCCEEDED,
        attempt(3, 1, Outcome.SUCCEEDED, 3.4, 3.6, worker="w3"),
        attempt(3, 2, Outcome.SUCCEEDED, 6.0, 6.2, worker="w2"),
    )
    ledger = [line for line in ledger if '"task": 3' not in line]
    ledger += ran(3, 1, 3.45, 3.5, "w3") + ran(3, 2, 6.05, 6.1, "w2")
    report = run([*tasks[:2], twice], ledger, faults, chords=[CHORD])
    assert kinds(report) == {Kind.CHORD, Kind.DOUBLE_SUCCESS}
    [chord] = [v for v in report.violations if v.kind is Kind.CHORD]
    assert (
        chord.detail == "callback ended succeeded with succeeded attempts [1, 2], not exactly one"
    )


def test_a_callback_that_missed_a_member_is_a_breach() -> None:
    tasks, ledger, faults = chord_history()
    # Member 2 was counted as ended (cancelled) and the callback ran without it.
    cancelled = replace(tasks[1], state=TaskState.CANCELLED, result=None)
    missed = replace(tasks[2], result=[0, "cancelled"])
    assert breaches([tasks[0], cancelled, missed], ledger, faults) == [
        (Kind.CHORD, 3, "member 2 ended cancelled, not succeeded"),
        (Kind.CHORD, 3, "callback returned [0, 'cancelled'], its members [0, None]"),
    ]
    # A result without member 2's, or with member 1's twice.
    for wrong in ([0], [0, 0, 1]):
        [(kind, _, detail)] = breaches(
            [*tasks[:2], replace(tasks[2], result=wrong)], ledger, faults
        )
        assert kind is Kind.CHORD and detail.startswith(f"callback returned {wrong!r}")
    # A member missing from the store.
    assert (Kind.CHORD, 3, "member 2 ended missing, not succeeded") in breaches(
        [tasks[0], tasks[2]], ledger, faults
    )


def test_a_callback_that_did_not_succeed_is_a_breach() -> None:
    tasks, ledger, faults = chord_history()
    cancelled = collect(TaskState.CANCELLED)
    ledger = [line for line in ledger if '"task": 3' not in line]
    assert breaches([*tasks[:2], cancelled], ledger, faults) == [
        (Kind.CHORD, 3, "callback ended cancelled with succeeded attempts [], not exactly one")
    ]
    # Succeeded in the store, but never executed by a handler.
    never = collect(TaskState.SUCCEEDED, attempt(3, 1, Outcome.SUCCEEDED, 3.4, 3.6))
    assert breaches([*tasks[:2], never], ledger, faults) == [
        (Kind.CHORD, 3, "callback succeeded without an execution in the ledger")
    ]


def tagged(task_id: int, tag: str, result: str | None) -> Task:
    state = TaskState.SUCCEEDED if result is not None else TaskState.IN_PROGRESS
    return replace(task(task_id, state), name=TAGGED_NAME, payload={"tag": tag}, result=result)


def test_the_wipe_checker_finds_a_task_completed_by_an_attempt_of_another() -> None:
    """Task 1 of round 0 is forgotten by the wipe at 10 s while its attempt
    runs; the attempt ends at 11 s. Round 1's task 1 ends with round 0's
    tag: a wrong completion. Without it, the run is clean."""
    rounds = [{1: "old", 2: "old2"}, {1: "new"}]
    ledger = [{"event": "end", "task": 1, "tag": "old", "at": 11.0}]
    wrong = check_wipe(rounds, [[], [tagged(1, "new", "old")]], [10.0], ledger, [7], [7])
    assert not wrong.ok
    assert wrong.wrong_completions and "round 1 task 1" in wrong.wrong_completions[0]
    assert (wrong.late_ends, wrong.reused_ids) == (1, 1)
    clean = check_wipe(rounds, [[], [tagged(1, "new", "new")]], [10.0], ledger, [7], [7])
    assert clean.ok, clean.summary()


def test_the_wipe_checker_wants_the_last_round_done_and_every_worker_registered() -> None:
    rounds = [{1: "old"}, {1: "new", 2: "other"}]
    ledger = [{"event": "end", "task": 1, "tag": "old", "at": 11.0}]
    held = [[], [tagged(1, "new", "new"), tagged(2, "other", None)]]
    report = check_wipe(rounds, held, [10.0], ledger, [7, 8], [7])
    assert report.lost_after_last_wipe == [2]
    assert report.unregistered_pids == [8]
    assert not report.ok
    # A run whose wipe met no attempt in flight proves nothing.
    done = [[], [tagged(1, "new", "new"), tagged(2, "other", "other")]]
    idle = check_wipe(rounds, done, [10.0], [], [7], [7])
    assert idle.late_ends == 0 and not idle.ok
