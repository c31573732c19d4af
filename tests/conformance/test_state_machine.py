"""Real backends against the in-memory backend, driven by random operation sequences.

A Hypothesis ``RuleBasedStateMachine`` drives two backends with identical
operations and the same injected clock: the memory backend (the model) and a
real one (PostgreSQL, SQLite, Redis). Rules: enqueue 1-3 tasks (priority, delay or
run_at, budget, per-task lease, queue, first workflow step), claim by a random
worker with a random limit, heartbeat and finish random subsets of the lease
tokens ever handed out (held, stale and foreign) from a random worker, with
any completion a worker may send (success, retry, failure, release, timeout,
cancel, step transition), advance the clock by up to three leases (so leases
expire, tasks are reclaimed and crash budgets run out), cancel and manually
retry a random task, and crash a worker (it stops calling; its leases expire).
Coroutine tasks (with an inbox, maybe a first message) take part too: an
outside send of 1-2 messages to random ids (missing, finished and plain tasks
included); a claim records the inbox each backend showed; a coroutine's
completion may rest (suspend, or sleep to a time) and carries effects that
consume exactly what its poll saw, maybe send one message and spawn one
child. Some enqueued tasks carry a unique key from a pool of three (with a
random scope, period and ``on_conflict``), so an enqueue often meets a held
key: it answers the holder's id, replaces a pending holder, or raises
``TaskExistsError`` storing nothing. Queues and the task name are paused and
resumed (claims then pass them by); finished tasks are pruned by cutoffs
relative to the clock and a small limit (the machine forgets them; their
tokens and ids stay in play, and any call on them must fail alike); two
schedules are synced and fired with drawn slots and fingerprints; and some
tasks (spawned children too) carry a flow-control key from a pool of three
(``FLOWS``: a running limit of 1 or 2 on one key, a limit with a rate, a
rate alone), so claims meet keys at their limit and empty rate buckets.
Some enqueues store dependents (``NewTask.after``; never a coroutine):
each waits for 0-3 stored tasks (in any state: those ended count at once)
and earlier tasks of its batch (``earlier``), under a drawn policy
(``AFTER_POLICIES``), and now and then names the last task pruned or a
missing id, so the enqueue raises TaskNotFoundError and stores nothing; the
two backends are given the same batch in their own ids. Every way a task
ends (a finish, a reclaim with its budget spent, a cancel, a bulk cancel, a
dependency ended by policy) then moves its waiting dependents. A bulk
cancel never names a dependency and its dependent together: whether the
dependent then ends cancelled or by its policy follows the order the store
applies the batch in.
PostgreSQL claims keyed and plain tasks in turns rather than merged in claim
order, so while keyed tasks wait its claims take everything they may and
their order is not compared. Redis prunes, within a state, the oldest finish
first (the others the lowest id), so where one batch would differ its
prunes take everything prunable.

After every rule it checks that

- both backends answer alike: claimed tokens and claim details, in claim order
  (priority desc, run_at, id); the renewed / lost / cancel_requested sets of a
  heartbeat; the applied / rejected sets of a finish; the state a cancel or
  retry returns, or the type of error it raises; the ids an enqueue or a fire
  returns (a held key's holder included) or the ``TaskExistsError`` it raises
  (key and holder); what a pause or resume returns and the pauses listed;
  what a prune deletes and ``count_prunable`` counts; the schedules listed;
  the flow-control keys listed (limit, running and pending tasks, rate
  tokens, next start); what a claim hands over as ``receives``.
  Ids are mapped between the backends by enqueue order, and the mapping must
  stay consistent;
- the fence holds in both: a heartbeat or finish takes effect exactly for the
  tokens that were live before it (this attempt, this worker, lease not yet
  expired); a renewal moves the lease and nothing else; a rejected write
  changes nothing;

and after every step (invariants, on both backends) that every task moved
only as the task state machine allows: its state before and after the rule
is joined by moves of ``conveyor.model.STATE_CHANGES`` whose causes that
rule can bring about (``RULE_CAUSES``: a claim, say, may reclaim, end an
expired lease, wake a parent and claim it, never succeed a task); that no
enqueued task is lost; a task has one ``in_progress`` attempt exactly when
it is in progress, the last one, owned by its worker; its ``attempt`` counts
its attempt rows, numbered 1..n; owner, lease, ``finished_at`` and result
match its state; the real backend's task (state, attempts with their outcomes, errors and steps,
owner, lease, cancel flag, result, step, payload, options, parent, inbox flag,
unique key)
equals the model's, ``waiting_for`` included (of a task not waiting,
only whether it has dependencies: the ends of one write count in the order
the store applies them, so a dependent one of them ended may or may not
have counted the others); every dependent's
dependencies (``Backend.dependencies``: ids in the order given, name,
state, result, error, settled) equal the model's, and one still waiting
waits for as many as it has edges not settled; the two stores hold the same tasks (none lost, none
pruned or stored in one only); every coroutine's unread messages (kind, sender, body, in
order; ends sent by one statement in any order) equal the model's; and so do
``count_unfinished`` and ``next_due_at``. SQL triggers (a child's end waking
its parent, a cancel reaching children, and then such a cancel moving the
children's dependents) stamp the real clock, years before
the injected one: those times are checked for plausibility and overwritten
with the model's (``restamp``); Redis has no triggers (its scripts take the
injected clock), so nothing is restamped there. A schedule synced without
``now`` takes the store's own clock too (its times are only checked to be
real-clock times), and so does a fire (its tasks are given a due time).

Times are compared rounded to the millisecond: storage precision differs
(PostgreSQL keeps microseconds, SQLite float seconds, Redis milliseconds),
and every time here is a multiple of half a second. ``created_at`` is
checked by ``test_replay_created_at_follows_the_injected_clock`` only.

The ``test_replay_*`` functions at the end replay, deterministically, minimal
sequences on which a real backend once disagreed with the model (claim order
among expired leases, ended tasks using up a claim's limit, a stale token
reported live by a heartbeat, a cancelled task's run time, ``created_at``
ignoring the injected clock; then, with inboxes, a first message waking a
delayed task, a finishing poll's message to itself, and a message to a
failing poll cutting its backoff short, where the memory backend wrote a
batch's effects and completions in another order than the SQL ones), so none of
them comes back; so do those found since with pauses, unique keys and
schedules (a key that changes hands in a batch, a holder replaced twice, a
pause holding back an expired lease's end, a fire meeting a held key).
Redis replays them all (it passed each when it joined the machine), and one
more replays the prune batch where it differs by design (finish order).
A prune batch taking the states in the order given is replayed too.
With dependencies, a chain whose middle link fails is replayed under each
policy, and so is a coroutine's cancel reaching a child that a task waits
for, a claim handing out the dependent its own sweep released, and a
dependent keeping its ``pending`` key while it still waits.

``CONVEYOR_MACHINE_DEPENDENCIES=0`` leaves dependencies out (no dependent is
enqueued, so nothing reads ``dependencies``): the machine as it ran before,
for an engine that does not keep them yet.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sqlite3
import tempfile
import unittest
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import pytest
from hypothesis import HealthCheck, Phase, event, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from conveyor import payload as codec
from conveyor.backends import Backend, backend_from_url
from conveyor.backends.capabilities import Inspector, capability_of
from conveyor.backends.params import (
    AFTER_POLICIES,
    ClaimedTask,
    ClaimParams,
    Completion,
    Delivery,
    Effects,
    EnqueueParams,
    ErrorInfo,
    FinishParams,
    FireParams,
    HeartbeatParams,
    NewTask,
    ScheduleSync,
    SendParams,
    Transition,
    WorkFilter,
    earlier,
    earlier_index,
)
from conveyor.backends.protocol import Capability
from conveyor.errors import ConveyorError, TaskExistsError, TaskNotFoundError
from conveyor.model import (
    STATE_CHANGES,
    Cause,
    LeaseToken,
    Message,
    MessageKind,
    Outcome,
    PauseKind,
    RetryPolicy,
    Task,
    TaskState,
)
from conveyor.records import (
    CancelMany,
    DependencyRecord,
    PruneParams,
    RetryMany,
    StoredSchedule,
    TaskFilter,
)
from tests.conftest import backend_url

T = TypeVar("T")

T0 = datetime(2030, 1, 1, tzinfo=UTC)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
LEASE = 10.0
TASK_LEASES = (None, 5.0, 20.0)
WORKERS = ("w1", "w2", "w3")
NAME = "job"
QUEUES = ("q1", "q2")
MAX_TASKS = 10
MISSING_ID = 10**9
# Spawned children may take the number of tasks past MAX_TASKS, up to this.
MAX_SPAWNED_TASKS = 16
# SQL triggers (a child's end waking its parent, a cancel reaching children)
# stamp times with the real clock, which is years before the injected one.
REAL_CLOCK_CUTOFF = T0 - timedelta(days=365)
# The kinds whose triggers do that, and whose times restamp overwrites.
# Redis has no triggers: a child's end waking its parent and a cancel
# reaching children run in the Lua script of the write that caused them,
# which takes the injected ``now`` (every script that writes a task's time
# does; only a fire and a worker's registration read the server's clock, and
# the model's fire reads its own clock too). Nothing is restamped there, so
# a real-clock time from Redis fails the comparison.
RESTAMPED = frozenset({"postgres", "sqlite"})
# A longer hunt than CI's: CONVEYOR_MACHINE_EXAMPLES=1000 pytest ... -k Agreement
EXAMPLES = int(os.environ.get("CONVEYOR_MACHINE_EXAMPLES", "40"))
# CI's run draws the same sequences every time (a landing never depends on a
# lucky draw); a hunt draws fresh ones: CONVEYOR_MACHINE_RANDOM=1.
FRESH_DRAWS = os.environ.get("CONVEYOR_MACHINE_RANDOM") == "1"
# A failing run shrinks for up to five minutes (Hypothesis' own cap); a
# longer hunt gets a second per example more.
FAILING_RUN_TIMEOUT = 420 + (EXAMPLES if EXAMPLES > 40 else 0)

# (outcome, next state) pairs a worker may send; see draw_completion for transitions.
COMPLETIONS = (
    (Outcome.SUCCEEDED, TaskState.SUCCEEDED),
    (Outcome.FAILED, TaskState.PENDING),
    (Outcome.FAILED, TaskState.FAILED),
    (Outcome.INTERRUPTED, TaskState.PENDING),
    (Outcome.TIMED_OUT, TaskState.FAILED),
    (Outcome.TIMED_OUT, TaskState.PENDING),
    (Outcome.CANCELLED, TaskState.CANCELLED),
)
ERRORS = {
    Outcome.FAILED: ErrorInfo("ValueError", "bad input", "Traceback (most recent call last): ..."),
    Outcome.TIMED_OUT: ErrorInfo("AttemptTimeoutError", "ran past its timeout"),
    Outcome.CANCELLED: ErrorInfo("CancelledByRequest", "cancelled while running"),
}
STEPS = ("reserve", "charge", "ship")
# The causes of the moves each rule may bring about, besides its own: a task
# that reaches a terminal state wakes its parent (message), a cancelled
# coroutine cancels its children (cancel), and its waiting dependents count
# its end (dependency: pending, or ended by their policy, and so on down a
# chain); an enqueue stores a dependent waiting, and counts at once the
# dependencies that ended already. No rule writes a corrupt row, so none may
# quarantine one. Rules not named here (heartbeat, advance, crash) move
# nothing; a manual retry ends nothing.
RULE_CAUSES: dict[str, frozenset[Cause]] = {
    "enqueue": frozenset({Cause.ENQUEUE, Cause.DEPENDENCY}),
    "claim": frozenset({Cause.CLAIM, Cause.RECLAIM, Cause.MESSAGE, Cause.CANCEL, Cause.DEPENDENCY}),
    "finish": frozenset(
        {
            Cause.SUCCEED,
            Cause.FAIL,
            Cause.RETRY,
            Cause.RELEASE,
            Cause.NEXT_STEP,
            Cause.SLEEP,
            Cause.SUSPEND,
            Cause.CANCEL,
            Cause.MESSAGE,
            Cause.SPAWN,
            Cause.DEPENDENCY,
        }
    ),
    "send": frozenset({Cause.MESSAGE}),
    "cancel": frozenset({Cause.CANCEL, Cause.MESSAGE, Cause.DEPENDENCY}),
    "retry": frozenset({Cause.MANUAL_RETRY}),
}
RESULTS: tuple[object, ...] = (None, 0, "ok", [1, "two"], {"k": {"n": 1}})
# Few unique keys, so that an enqueue often finds its key held; only the
# last is ever held for a period.
KEYS = ("k1", "k2", "k3")
PERIOD_KEY = KEYS[-1]
SCOPES = ("pending", "active", None)
CONFLICTS = ("existing", "replace", "raise")
# Flow-control keys, as (key, running limit, rate limit, rate period): two
# limits on one key (the newest claimed task's applies), a key with a limit
# and a rate, and one with a rate only.
FLOWS = (
    ("c1", 1, None, None),
    ("c1", 2, None, None),
    ("c2", 1, 1, 5.0),
    ("r1", None, 2, 10.0),
)
# The limit of a claim that takes every task it may (see claim).
EVERYTHING = 100
# What may be paused: the machine's queues and its task name.
PAUSABLE = (
    (PauseKind.QUEUE, QUEUES[0]),
    (PauseKind.QUEUE, QUEUES[1]),
    (PauseKind.TASK, NAME),
)
FINISHED = (TaskState.SUCCEEDED, TaskState.FAILED, TaskState.CANCELLED)
# A prune's cutoffs, in seconds from the clock (finished_at < cutoff goes).
PRUNE_CUTOFFS = (-30.0, -10.0, -0.5, 0.0, 1.0)
SCHEDULE_NAMES = ("s1", "s2")
SCHEDULE_TASKS = (NAME, "report")
# Schedule definitions, each with its fingerprint; ``args`` as PostgreSQL's
# jsonb writes it back.
DEFINITIONS = (
    StoredSchedule("", "", "0 3 * * *", None, "Europe/Paris", "latest", 10, '{"full": true}', "f1"),
    StoredSchedule("", "", None, 60.0, "UTC", "all", 3, "{}", "f2"),
    StoredSchedule("", "", "*/5 * * * *", None, "UTC", "skip", 1, '[1, "two"]', "f3"),
)
SCHEDULES = st.builds(
    replace,
    st.sampled_from(DEFINITIONS),
    name=st.sampled_from(SCHEDULE_NAMES),
    task=st.sampled_from(SCHEDULE_TASKS),
)
# Slots a fire takes, in seconds from the clock (one or two, increasing).
SLOT_OFFSETS = (-20.0, -10.0, -0.5, 0.0, 1.0, 5.0)
# Dependencies (``enqueue_dependents``) on or off:
# CONVEYOR_MACHINE_DEPENDENCIES=0 runs the machine without them, for an
# engine that does not keep them yet.
DEPENDENCIES = os.environ.get("CONVEYOR_MACHINE_DEPENDENCIES", "1") != "0"
# The flow-control keys a dependent may carry: one limit per key. The ends
# of one write may make several dependents pending, in an order that is not
# the same on every backend, and of several tasks of one key made pending
# together the first sets the key's limit (guarantees.md, Limits).
DEPENDENT_FLOWS = tuple(flow for flow in FLOWS if flow[0] != "c1")


@dataclass(frozen=True)
class Spec:
    """One task to enqueue, relative to the clock of the moment."""

    priority: int = 0
    delay: float = 0.0
    explicit_run_at: bool = False
    max_attempts: int = 3
    lease: float | None = None
    queue: str = QUEUES[0]
    step: str | None = None
    inbox: bool = False
    """A coroutine task (never with a step)."""
    message: bool = False
    """A coroutine task's first message."""
    key: str | None = None
    scope: str | None = None
    period: float | None = None
    on_conflict: str = "existing"
    """Its unique key, scope, period and on_conflict, as on NewTask (a
    spawned child has no key)."""
    flow: tuple[str, int | None, int | None, float | None] | None = None
    """Its flow-control key (one of FLOWS), spawned children's too."""


def coherent_spec(spec: Spec) -> Spec:
    """Only coroutine tasks have a first message, and they have no step. Only
    PERIOD_KEY is held for a period."""
    if spec.key != PERIOD_KEY:
        spec = replace(spec, period=None)
    if not spec.inbox:
        return replace(spec, message=False)
    return replace(spec, step=None)


SPECS = st.builds(
    Spec,
    priority=st.integers(0, 2),
    delay=st.sampled_from([0.0, 5.0, 15.0, -5.0]),
    explicit_run_at=st.booleans(),
    max_attempts=st.integers(1, 3),
    lease=st.sampled_from(TASK_LEASES),
    queue=st.sampled_from(QUEUES),
    step=st.sampled_from([None, None, STEPS[0]]),
    inbox=st.booleans(),
    message=st.booleans(),
    key=st.sampled_from((None, None, None, *KEYS)),
    scope=st.sampled_from(SCOPES),
    period=st.sampled_from((None, None, 10.0, 30.0)),
    on_conflict=st.sampled_from(CONFLICTS),
    flow=st.sampled_from((None, None, *FLOWS)),
).map(coherent_spec)


def ms(value: datetime | None) -> int | None:
    """A time as whole milliseconds since the epoch (the comparison's precision)."""
    if value is None:
        return None
    assert value.utcoffset() is not None, f"naive datetime {value!r} from a backend"
    return ((value - EPOCH) // timedelta(microseconds=1) + 500) // 1000


def same_id(task_id: int) -> int:
    return task_id


def view(task: Task, model_id: Callable[[int], int] = same_id) -> dict[str, Any]:
    """What must agree between backends, with ids in the model's numbering."""
    return {
        "id": model_id(task.id),
        "name": task.name,
        "queue": task.queue,
        "payload": task.payload,
        "state": task.state,
        "priority": task.priority,
        "run_at": ms(task.run_at),
        "attempt": task.attempt,
        "max_attempts": task.max_attempts,
        "retry": task.retry,
        "timeout": task.timeout,
        "lease": task.lease,
        "result": task.result,
        "finished_at": ms(task.finished_at),
        "worker_id": task.worker_id,
        "lease_expires_at": ms(task.lease_expires_at),
        "cancel_requested": task.cancel_requested,
        "step": task.step,
        "parent_id": model_id(task.parent_id) if task.parent_id is not None else None,
        "inbox": task.inbox,
        "idempotency_key": task.idempotency_key,
        # How many it waits for, while it waits; else only whether it has
        # dependencies: the ends of one write (a bulk cancel, a worker's
        # completions) are counted in the order the store applies them, so
        # a dependent one of them ended may or may not have counted the
        # others (and a manual retry keeps the count).
        "waiting_for": task.waiting_for
        if task.state is TaskState.WAITING
        else task.waiting_for is not None,
        "attempts": [
            (
                model_id(a.task_id),
                a.number,
                a.worker_id,
                a.outcome,
                ms(a.started_at),
                ms(a.finished_at),
                a.error_type,
                a.error_message,
                a.traceback,
                a.step,
            )
            for a in task.attempts
        ],
    }


def claimed_view(claimed: ClaimedTask, model_token: LeaseToken) -> tuple[Any, ...]:
    return (
        (model_token.task_id, model_token.attempt, model_token.worker_id),
        claimed.name,
        claimed.queue,
        codec.decode(claimed.payload),
        claimed.spent,
        claimed.max_attempts,
        claimed.retry,
        claimed.timeout,
        claimed.lease,
        ms(claimed.lease_expires_at),
        claimed.step,
        claimed.receives,
    )


def dependency_view(
    record: DependencyRecord, model_id: Callable[[int], int] = same_id
) -> tuple[Any, ...]:
    """A dependency as ``Backend.dependencies`` reads it, in the model's numbering."""
    return (
        model_id(record.task_id),
        record.name,
        record.state,
        record.result,
        record.error_type,
        record.error_message,
        record.settled,
    )


def message_view(message: Message, model_id: Callable[[int], int] = same_id) -> tuple[Any, ...]:
    """A message as it must agree between backends (message ids may differ)."""
    body = message.body
    if message.kind is MessageKind.END:
        body = {**body, "child": model_id(body["child"])}
    sender = model_id(message.sender_id) if message.sender_id is not None else None
    return (message.kind, sender, body)


def ends_unordered(views: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Consecutive end messages sorted by child: children that end in one
    statement send their ends in the order the database updates their rows."""
    out: list[tuple[Any, ...]] = []
    run: list[tuple[Any, ...]] = []
    for view_ in [*views, None]:
        if view_ is not None and view_[0] is MessageKind.END:
            run.append(view_)
            continue
        out.extend(sorted(run, key=lambda v: v[1]))
        run = []
        if view_ is not None:
            out.append(view_)
    return out


def check_shape(task: Task, kind: str) -> None:
    """The invariants every stored task keeps, in any backend."""
    where = f"{kind} task {task.id}"
    assert isinstance(task.state, TaskState), where
    numbers = [a.number for a in task.attempts]
    assert numbers == list(range(1, len(numbers) + 1)), f"{where}: attempt numbers {numbers}"
    assert task.attempt == len(task.attempts), f"{where}: attempt {task.attempt} vs {numbers}"
    running = [a for a in task.attempts if a.outcome is Outcome.IN_PROGRESS]
    in_progress = task.state is TaskState.IN_PROGRESS
    assert len(running) == int(in_progress), f"{where} is {task.state}, running: {running}"
    assert (task.worker_id is not None) == in_progress, where
    assert (task.lease_expires_at is not None) == in_progress, where
    if in_progress:
        assert task.attempts[-1] == running[0], where
        assert running[0].worker_id == task.worker_id, where
    for a in task.attempts:
        assert (a.finished_at is None) == (a.outcome is Outcome.IN_PROGRESS), f"{where}: {a}"
    assert (task.finished_at is not None) == task.state.is_terminal, where
    assert task.result is None or task.state is TaskState.SUCCEEDED, where
    # Only a coroutine (for a message) or a dependent (for its dependencies) waits.
    if task.state is TaskState.WAITING:
        assert task.inbox or task.waiting_for, f"{where} waits for nothing"


def reachable(start: TaskState | None, causes: frozenset[Cause]) -> frozenset[TaskState]:
    """The states a task in ``start`` (None: not stored yet) can be in after
    one or more moves of the table, each by one of ``causes``."""
    found: set[TaskState] = set()
    frontier: list[TaskState | None] = [start]
    while frontier:
        state = frontier.pop()
        for change in STATE_CHANGES:
            if (
                change.from_state is state
                and change.cause in causes
                and change.to_state not in found
            ):
                found.add(change.to_state)
                frontier.append(change.to_state)
    return frozenset(found)


def moved(before: Task, after: Task) -> bool:
    """Whether a task moved between two snapshots: a new state, or the same
    one with a new attempt, a cancel request or a new run time."""
    return (before.state, before.attempt, before.cancel_requested, ms(before.run_at)) != (
        after.state,
        after.attempt,
        after.cancel_requested,
        ms(after.run_at),
    )


def illegal_moves(
    before: dict[int, Task], after: dict[int, Task], causes: frozenset[Cause]
) -> list[str]:
    """The tasks of ``after`` whose change since ``before`` (where a task
    missing was not stored yet) no chain of moves of the table, each by one
    of ``causes``, explains. A new attempt needs a claim or a reclaim."""
    wrong = []
    may_cause = ", ".join(sorted(causes)) or "nothing"
    for task_id, task in after.items():
        old = before.get(task_id)
        if old is not None and not moved(old, task):
            continue
        start = old.state if old is not None else None
        if task.state not in reachable(start, causes):
            wrong.append(f"task {task_id}: {start or '(new)'} -> {task.state} ({may_cause})")
        elif (
            old is not None
            and old.attempt != task.attempt
            and not causes & {Cause.CLAIM, Cause.RECLAIM}
        ):
            wrong.append(f"task {task_id}: attempt {old.attempt} -> {task.attempt} ({may_cause})")
    return wrong


def live(task: Task | None, token: LeaseToken, worker_id: str, now: datetime) -> bool:
    """The fence, read from a snapshot taken before the write (None: pruned)."""
    return (
        task is not None
        and task.attempt == token.attempt
        and task.worker_id == worker_id
        and task.lease_expires_at is not None
        and task.lease_expires_at > now
    )


def stamp(value: datetime | None) -> int | str | None:
    """A time as :func:`ms`, or "real clock" for one the store took from its
    own clock (no ``now`` given), years before the injected one."""
    if value is not None and value < REAL_CLOCK_CUTOFF:
        assert abs(value - datetime.now(UTC)) < timedelta(hours=1), f"implausible time {value}"
        return "real clock"
    return ms(value)


def schedule_view(
    schedule: StoredSchedule, model_id: Callable[[int], int] = same_id
) -> tuple[Any, ...]:
    """A stored schedule as it must agree between backends."""
    last_task = schedule.last_task_id
    return (
        *(schedule.name, schedule.task, schedule.cron, schedule.every, schedule.tz),
        *(schedule.missed, schedule.catch_up, schedule.args, schedule.fingerprint),
        stamp(schedule.last_slot),
        model_id(last_task) if last_task is not None else None,
        stamp(schedule.synced_at),
        schedule.release,
    )


def json_key(value: object) -> str:
    return codec.encode(value)


def note(text: str) -> None:
    """Count a case for ``--hypothesis-show-statistics`` (replays run outside Hypothesis)."""
    if currently_in_test_context():
        event(text)


class BackendAgreement(RuleBasedStateMachine):
    """The memory backend (model) and a real backend, driven in lockstep."""

    KIND: ClassVar[str] = ""

    def __init__(self) -> None:
        super().__init__()
        self.now = T0
        self.loop = asyncio.new_event_loop()
        self.tmpdir: str | None = None
        self.opened: list[Backend] = []  # closed (and destroyed) at teardown
        try:
            self.model = self.open(backend_from_url(f"memory://{uuid.uuid4().hex}"))
            self.real = self.open_real()
        except BaseException:
            self.teardown()
            raise
        # Task ids in enqueue order, and the mapping between the two numberings.
        self.ids: list[int] = []
        self.to_real: dict[int, int] = {}
        self.to_model: dict[int, int] = {}
        # Every lease token ever handed out (model numbering), and those whose
        # worker still believes it holds them (insertion-ordered, for replay).
        self.handed: list[LeaseToken] = []
        self.held: dict[LeaseToken, None] = {}
        # The real backend's nonce of each token it handed out (model numbering).
        self.nonces: dict[LeaseToken, str] = {}
        self.payloads = 0
        # Coroutine tasks (model ids), and the ids of the messages each
        # backend's inbox() showed when a coroutine task was claimed.
        self.coroutines: set[int] = set()
        self.seen: dict[LeaseToken, tuple[tuple[int, ...], tuple[int, ...]]] = {}
        self.targets: set[int] = set()  # tasks sent a message since the last check
        # The causes of the moves the rules run since the last check may
        # bring about, and each backend's tasks as that check saw them.
        self.causes: set[Cause] = set()
        self.seen_tasks: tuple[dict[int, Task], dict[int, Task]] = ({}, {})
        # Tasks pruned (model ids, in order; they stay mapped), and pending
        # holders of a key an enqueue replaced since the last check (their
        # run time moved without a move of the table).
        self.pruned: list[int] = []
        self.replaced: set[int] = set()
        # Each dependent's dependencies (model ids, in the order given), as
        # the enqueue that stored it resolved them.
        self.edges: dict[int, tuple[int, ...]] = {}

    def open(self, backend: Backend) -> Backend:
        self.run(backend.open())
        self.opened.append(backend)
        return backend

    def open_real(self) -> Backend:
        self.tmpdir = tempfile.mkdtemp(prefix="conveyor-machine-")
        url, options = backend_url(self.KIND, f"t_{uuid.uuid4().hex[:12]}", Path(self.tmpdir))
        return self.open(backend_from_url(url, **options))

    def teardown(self) -> None:
        try:
            for backend in reversed(self.opened):
                try:
                    self.run(backend.destroy())
                finally:
                    self.run(backend.close())
            self.run(self.loop.shutdown_asyncgens())
        finally:
            self.loop.close()
            if self.tmpdir is not None:
                shutil.rmtree(self.tmpdir, ignore_errors=True)

    # -- plumbing ------------------------------------------------------------

    def run(self, awaitable: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(awaitable)

    def real_token(self, token: LeaseToken) -> LeaseToken:
        nonce = self.nonces.get(token, "")
        return replace(token, task_id=self.to_real[token.task_id], nonce=nonce)

    def model_token(self, token: LeaseToken) -> LeaseToken:
        assert token.task_id in self.to_model, f"real backend returned unknown task {token}"
        return replace(token, task_id=self.to_model[token.task_id], nonce="")

    def model_tokens(self, tokens: Iterable[LeaseToken]) -> frozenset[LeaseToken]:
        return frozenset(self.model_token(t) for t in tokens)

    def real_model_id(self, task_id: int) -> int:
        return self.to_model[task_id]

    def real_id(self, task_id: int) -> int:
        return self.to_real.get(task_id, task_id)

    def inboxes(self, model_id: int) -> tuple[list[Message], list[Message]]:
        model, real = self.model, self.real
        return self.run(model.inbox(model_id)), self.run(real.inbox(self.real_id(model_id)))

    def write_real(
        self, real_id: int, run_at: datetime | None, finished_at: datetime | None
    ) -> None:
        """Overwrite times the real backend's triggers took from the real clock."""
        real = self.real
        if self.KIND == "postgres":

            async def update() -> None:
                async with real.pool.connection() as conn:  # type: ignore[attr-defined]
                    await conn.execute(
                        f"update {real.schema}.tasks"  # type: ignore[attr-defined]
                        " set run_at = coalesce(%s, run_at),"
                        " finished_at = coalesce(%s, finished_at) where id = %s",
                        (run_at, finished_at, real_id),
                    )

            self.run(update())
            return
        assert self.KIND == "sqlite", self.KIND
        conn = sqlite3.connect(real.path, timeout=10)  # type: ignore[attr-defined]
        try:
            with conn:
                conn.execute(
                    "update conveyor_tasks set run_at = coalesce(?, run_at),"
                    " finished_at = coalesce(?, finished_at) where id = ?",
                    (
                        run_at.timestamp() if run_at else None,
                        finished_at.timestamp() if finished_at else None,
                        real_id,
                    ),
                )
        finally:
            conn.close()

    def restamp(self, model_tasks: dict[int, Task], real_tasks: dict[int, Task]) -> None:
        """Times a real backend's trigger stamped with the real clock (years
        before the injected one) become the model's, in the store and in
        ``real_tasks``: a woken parent's run_at (the model's must be due) and
        a cascaded cancel's finished_at; and the run_at of a dependent such a
        cancel made pending (the trigger takes the later of its own run_at
        and its dependency's finished_at, there the real clock, so its own:
        the model's, later, must be due). Only on the kinds in RESTAMPED."""
        if self.KIND not in RESTAMPED:
            return
        ended_by_real_clock: set[int] = set()
        for task_id, task in list(real_tasks.items()):
            want = model_tasks[task_id]
            run_at = finished_at = None
            if task.run_at < REAL_CLOCK_CUTOFF:
                assert want.run_at <= self.now, f"task {task_id} woken in {self.KIND} only"
                run_at = want.run_at
                note("restamp: a woken task's run_at")
            if task.finished_at is not None and task.finished_at < REAL_CLOCK_CUTOFF:
                assert want.finished_at is not None, f"task {task_id} ended in {self.KIND} only"
                finished_at = want.finished_at
                ended_by_real_clock.add(task_id)
                note("restamp: a cascaded cancel's finished_at")
            if run_at is not None or finished_at is not None:
                self.write_real(self.to_real[task_id], run_at, finished_at)
                real_tasks[task_id] = replace(
                    task, run_at=run_at or task.run_at, finished_at=finished_at or task.finished_at
                )
        for task_id, dependencies in self.edges.items():
            released, want_released = real_tasks.get(task_id), model_tasks.get(task_id)
            if (
                released is None
                or want_released is None
                or not ended_by_real_clock.intersection(dependencies)
                or released.state is not TaskState.PENDING
                or want_released.state is not TaskState.PENDING
                or not released.run_at < want_released.run_at <= self.now
            ):
                continue
            note("restamp: a dependent made pending by a cascaded cancel")
            self.write_real(self.to_real[task_id], want_released.run_at, None)
            real_tasks[task_id] = replace(released, run_at=want_released.run_at)

    def fetch(self, model_ids: Iterable[int]) -> tuple[dict[int, Task], dict[int, Task]]:
        """Snapshots of these tasks (model numbering) from the model and the
        real backend; a pruned task is in neither."""
        model, real = self.model, self.real
        found: tuple[dict[int, Task], dict[int, Task]] = ({}, {})
        for task_id in dict.fromkeys(model_ids):
            want = self.run(model.get_task(task_id, with_attempts=True))
            have = self.run(real.get_task(self.to_real[task_id], with_attempts=True))
            if want is None or have is None:
                assert want is have, f"task {task_id} is stored in one backend only: {want, have}"
                assert task_id in self.pruned, f"task {task_id} is lost"
                continue
            found[0][task_id], found[1][task_id] = want, have
        return found

    def views(self, model_tasks: dict[int, Task], real_tasks: dict[int, Task]) -> tuple[Any, Any]:
        return (
            {i: view(t) for i, t in model_tasks.items()},
            {i: view(t, self.real_model_id) for i, t in real_tasks.items()},
        )

    def outcome(self, call: Callable[[], Awaitable[T]]) -> tuple[str, object]:
        """What a control call did: its return value, or the type of error it raised."""

        async def attempt() -> T:
            return await call()

        try:
            return "returned", self.run(attempt())
        except ConveyorError as exc:
            return "raised", type(exc)

    def insert(
        self, backend: Backend, call: Callable[[Backend], Awaitable[list[int]]]
    ) -> tuple[str, object]:
        """What an enqueue (or fire) did: its ids, or the key and holder (model
        numbering) of the TaskExistsError it raised, or the type of another error."""

        async def attempt() -> list[int]:
            return await call(backend)

        try:
            return "returned", self.run(attempt())
        except TaskExistsError as exc:
            holder = exc.task_id if backend is self.model else self.to_model.get(exc.task_id)
            return "raised", (TaskExistsError, exc.name, exc.key, holder)
        except ConveyorError as exc:
            return "raised", type(exc)

    def draw_call(self, data: st.DataObject) -> tuple[str, list[LeaseToken]]:
        """A worker and the tokens it sends: mostly leases it still holds, else
        any of its tokens (current and stale), else anyone's (foreign ones)."""
        holders = list(dict.fromkeys(t.worker_id for t in self.held))
        worker = data.draw(st.sampled_from([*holders, *WORKERS]), label="worker")
        held = [t for t in self.held if t.worker_id == worker]
        own = [t for t in self.handed if t.worker_id == worker]
        pools = [pool for pool in (held, held, own, self.handed) if pool]
        pool = data.draw(st.sampled_from(pools), label="token pool")
        tokens = data.draw(
            st.lists(st.sampled_from(pool), min_size=1, max_size=3, unique=True), label="tokens"
        )
        return worker, tokens

    def draw_completion(self, data: st.DataObject, token: LeaseToken) -> Completion:
        """A completion a worker could send: see COMPLETIONS; a step workflow's
        transition is a success that makes the task pending at its next step."""
        coroutine = token.task_id in self.coroutines
        if coroutine and data.draw(st.booleans(), label="rest"):
            return self.draw_rest(data, token)
        outcome, state = data.draw(st.sampled_from(COMPLETIONS), label="completion")
        if (
            not coroutine
            and outcome is Outcome.SUCCEEDED
            and data.draw(st.booleans(), label="transition")
        ):
            spec = data.draw(SPECS, label="next step")
            budget = spec.max_attempts
            transition = Transition(
                step=data.draw(st.sampled_from(STEPS), label="step"),
                state=codec.encode({"step_of": token.task_id, "n": self.payloads}),
                max_attempts=budget,
                retry=RetryPolicy(max_attempts=budget),
                lease=spec.lease,
                run_at=self.now + timedelta(seconds=spec.delay) if spec.explicit_run_at else None,
                delay=0.0 if spec.explicit_run_at else max(spec.delay, 0.0),
            )
            return Completion(token, outcome, TaskState.PENDING, transition=transition)
        result = data.draw(st.sampled_from(RESULTS), label="result")
        delay = data.draw(st.sampled_from([None, 0.0, 5.0, 15.0]), label="retry_delay")
        return Completion(
            token,
            outcome,
            state,
            result=codec.encode(result) if state is TaskState.SUCCEEDED else None,
            error=ERRORS.get(outcome),
            retry_delay=delay if state is TaskState.PENDING else None,
            effects=self.draw_effects(data, token)
            if coroutine and outcome is Outcome.SUCCEEDED
            else None,
        )

    def draw_rest(self, data: st.DataObject, token: LeaseToken) -> Completion:
        """A coroutine poll that ends resting: suspended until a message, or
        asleep until a time (pending), with its effects."""
        self.payloads += 1
        sleep = data.draw(st.sampled_from([None, 0.0, 5.0, 15.0]), label="sleep")
        explicit = data.draw(st.booleans(), label="explicit wake time")
        transition = Transition(
            step=None,
            state=codec.encode({"rest_of": token.task_id, "n": self.payloads}),
            max_attempts=3,
            retry=RetryPolicy(max_attempts=3),
            lease=data.draw(st.sampled_from(TASK_LEASES), label="lease"),
            run_at=self.now + timedelta(seconds=sleep) if sleep is not None and explicit else None,
            delay=sleep if sleep is not None and not explicit else 0.0,
        )
        return Completion(
            token,
            Outcome.SUCCEEDED,
            TaskState.WAITING if sleep is None else TaskState.PENDING,
            transition=transition,
            effects=self.draw_effects(data, token),
        )

    def draw_effects(self, data: st.DataObject, token: LeaseToken) -> Effects:
        """Consume exactly what this poll saw; maybe send one message (to any
        task, itself or a missing one) and spawn one child."""
        sends: tuple[Delivery, ...] = ()
        spawns: tuple[NewTask, ...] = ()
        if data.draw(st.booleans(), label="send"):
            target = data.draw(
                st.sampled_from([*self.ids, token.task_id, MISSING_ID]), label="send to"
            )
            self.payloads += 1
            body = codec.encode({"from": token.task_id, "n": self.payloads})
            sends = (Delivery(target, body, token.task_id),)
            if target in self.to_real:
                self.targets.add(target)
        spawn = data.draw(st.sampled_from([True, True, False]), label="spawn")
        if len(self.ids) < MAX_SPAWNED_TASKS and spawn:
            spec = data.draw(SPECS, label="child")
            spawns = (self.new_task(spec, parent_id=token.task_id),)
        return Effects(consumed=self.seen.get(token, ((), ()))[0], sends=sends, spawns=spawns)

    def real_completion(self, c: Completion) -> Completion:
        """A completion in the real backend's numbering."""
        token = self.real_token(c.token)
        if c.effects is None:
            return replace(c, token=token)
        effects = Effects(
            consumed=self.seen.get(c.token, ((), ()))[1],
            sends=tuple(
                replace(d, task_id=self.real_id(d.task_id), sender_id=token.task_id)
                for d in c.effects.sends
            ),
            spawns=tuple(replace(n, parent_id=token.task_id) for n in c.effects.spawns),
        )
        assert c.effects.consumed == self.seen.get(c.token, ((), ()))[0]
        return replace(c, token=token, effects=effects)

    def new_task(self, spec: Spec, parent_id: int | None = None) -> NewTask:
        """The task ``spec`` describes; a spawned child (``parent_id``) has no key."""
        self.payloads += 1
        key = spec.key if parent_id is None else None
        flow_key, concurrency, rate, period = spec.flow or (None, None, None, None)
        return NewTask(
            name=NAME,
            queue=spec.queue,
            payload=codec.encode({"n": self.payloads}),
            priority=spec.priority,
            max_attempts=spec.max_attempts,
            retry=RetryPolicy(max_attempts=spec.max_attempts),
            run_at=self.now + timedelta(seconds=spec.delay) if spec.explicit_run_at else None,
            delay=0.0 if spec.explicit_run_at else max(spec.delay, 0.0),
            lease=spec.lease,
            step=spec.step,
            inbox=spec.inbox,
            parent_id=parent_id,
            message=codec.encode({"first": self.payloads}) if spec.message else None,
            idempotency_key=key,
            unique_scope=spec.scope if key is not None else None,
            unique_for=spec.period if key is not None else None,
            on_conflict=spec.on_conflict,
            concurrency_key=flow_key,
            concurrency_limit=concurrency,
            rate_limit=rate,
            rate_period=period,
        )

    def draw_task(self, data: st.DataObject) -> int:
        # Running tasks weigh double: cancelling one is the case with the most to check.
        # The last task pruned is as missing as MISSING_ID, in both backends.
        running = [t.task_id for t in self.held]
        pool = [*self.ids, *running, *self.pruned[-1:], MISSING_ID]
        return data.draw(st.sampled_from(pool), label="task")

    # -- rules ---------------------------------------------------------------

    @initialize(specs=st.lists(SPECS, min_size=1, max_size=3), uniform=st.booleans())
    def first_enqueue(self, specs: list[Spec], uniform: bool) -> None:
        self.enqueue(specs, uniform)

    @precondition(lambda self: len(self.ids) < MAX_TASKS)
    @rule(specs=st.lists(SPECS, min_size=1, max_size=3), uniform=st.booleans())
    def enqueue(self, specs: list[Spec], uniform: bool) -> None:
        if uniform:  # one shared set of options: PostgreSQL's enqueue_uniform path
            specs = [specs[0]] * len(specs)
        self.enqueue_tasks([self.new_task(spec) for spec in specs])

    def enqueue_tasks(self, tasks: list[NewTask]) -> None:
        params = EnqueueParams(tasks=tasks, now=self.now)
        self.insert_both(f"enqueue({tasks})", lambda b: b.enqueue(params), tasks)

    @precondition(lambda self: DEPENDENCIES and len(self.ids) < MAX_TASKS)
    @rule(data=st.data(), specs=st.lists(SPECS, min_size=1, max_size=3))
    def enqueue_dependents(self, data: st.DataObject, specs: list[Spec]) -> None:
        """Enqueue 1-3 tasks, each but a coroutine waiting for 0-3 stored
        tasks (in any state: ended ones count at once) and earlier tasks of
        the batch (``earlier``), under a drawn policy; now and then one names
        the last task pruned or a missing id, and the enqueue must raise
        TaskNotFoundError and store nothing."""
        tasks = []
        keys: set[str | None] = {None}
        for index, spec in enumerate(specs):
            pool = [*self.ids, *(earlier(k) for k in range(index))]
            after: list[int] = []
            if not spec.inbox and pool:
                after = data.draw(st.lists(st.sampled_from(pool), max_size=3), label="after")
            if not spec.inbox and data.draw(st.sampled_from([False] * 9 + [True]), label="gone"):
                after.append(
                    data.draw(st.sampled_from([*self.pruned[-1:], MISSING_ID]), label="gone id")
                )
            if after:
                # A key repeated in the batch answers the batch's first task
                # with it, and a dependent that meets a held key stores no
                # edge: its key is left out, so that it waits as drawn.
                # One limit per key: see DEPENDENT_FLOWS.
                spec = replace(
                    spec,
                    key=None if spec.key in keys else spec.key,
                    flow=spec.flow if spec.flow in DEPENDENT_FLOWS else None,
                )
            keys.add(spec.key)
            task = self.new_task(spec)
            if after:
                policy = data.draw(st.sampled_from(AFTER_POLICIES), label="after_policy")
                receives = data.draw(st.sampled_from([None, "results"]), label="receives")
                task = replace(task, after=tuple(after), after_policy=policy, receives=receives)
            tasks.append(task)
        if any(r in (MISSING_ID, *self.pruned[-1:]) for t in tasks for r in t.after):
            # Whether a missing dependency or a held key with ``raise`` is
            # found first is the store's choice: a batch has only the one.
            tasks = [
                t if t.on_conflict != "raise" else replace(t, on_conflict="existing") for t in tasks
            ]
        self.enqueue_with_dependencies(tasks)

    def enqueue_with_dependencies(self, tasks: list[NewTask]) -> None:
        """Enqueue ``tasks`` (dependencies in the model's numbering) in both
        backends: the real one is given its own ids; then record the edges
        of each dependent stored."""
        real_tasks = [
            replace(t, after=tuple(r if r < 0 else self.real_id(r) for r in t.after)) for t in tasks
        ]
        stored_before = set(self.to_real)
        model_params = EnqueueParams(tasks=tasks, now=self.now)
        real_params = EnqueueParams(tasks=real_tasks, now=self.now)
        ids = self.insert_both(
            f"enqueue({tasks})",
            lambda b: b.enqueue(model_params if b is self.model else real_params),
            tasks,
        )
        for task_id, task in zip(ids, tasks, strict=bool(ids)):
            if not task.after or task_id in stored_before or task_id in self.edges:
                continue
            note(f"enqueue: a dependent ({task.after_policy})")
            self.edges[task_id] = tuple(
                ids[position] if (position := earlier_index(r)) is not None else r
                for r in task.after
            )

    def insert_both(
        self,
        what: str,
        call: Callable[[Backend], Awaitable[list[int]]],
        tasks: Sequence[NewTask],
    ) -> list[int]:
        """Store ``tasks`` (an enqueue or a fire) in both backends: the ids
        agree (see add_ids), or both raise TaskExistsError for the same key and
        holder, or TaskNotFoundError for a dependency not stored. The model's
        ids ([] for a fire that fired nothing)."""
        self.causes |= RULE_CAUSES["enqueue"]
        expected, got = self.insert(self.model, call), self.insert(self.real, call)
        where = f"{what} at {self.now}"
        assert got[0] == expected[0], f"{where}: {expected} vs {got}"
        if expected[0] == "raised":
            if expected[1] is TaskNotFoundError:
                note(f"{what.partition('(')[0]}: a dependency not stored raised")
            else:
                assert expected[1][0] is TaskExistsError, expected  # type: ignore[index]
                note(f"{what.partition('(')[0]}: a held key raised")
            assert got == expected, where
            return []
        model_ids, real_ids = expected[1], got[1]
        assert isinstance(model_ids, list) and isinstance(real_ids, list)
        if model_ids or real_ids:
            self.add_ids(model_ids, real_ids, tasks)
        return model_ids

    def add_ids(self, model_ids: list[int], real_ids: list[int], tasks: Sequence[NewTask]) -> None:
        """Map the ids an enqueue (or a fire) returned: a task it stored is new
        in both (ids increasing, above every id ever given); a held key is its
        holder's id in both, or the id of the batch's first task with that key."""
        assert len(model_ids) == len(real_ids) == len(tasks), f"{model_ids} vs {real_ids}"
        for ids, known in ((model_ids, self.to_real), (real_ids, self.to_model)):
            new = list(dict.fromkeys(i for i in ids if i not in known))
            assert new == sorted(new), f"ids not increasing: {ids}"
            assert all(i > k for i in new for k in known), f"ids not in enqueue order: {ids}"
        stored_before = set(self.to_real)
        for model_id, real_id, task in zip(model_ids, real_ids, tasks, strict=True):
            if model_id not in self.to_real:
                assert real_id not in self.to_model, f"{model_ids} vs {real_ids}"
                self.add_task(model_id, real_id, task.inbox)
                continue
            assert self.to_real[model_id] == real_id, f"{model_ids} vs {real_ids}"
            if model_id not in stored_before:
                note("enqueue: a key repeated in one batch")
            else:
                note(f"enqueue: a held key ({task.on_conflict}) answered its holder")
                if task.on_conflict == "replace":
                    self.replaced.add(model_id)

    def add_task(self, model_id: int, real_id: int, inbox: bool) -> None:
        if model_id != real_id:
            note("ids differ between the backends")
        self.to_real[model_id] = real_id
        self.to_model[real_id] = model_id
        self.ids.append(model_id)
        if inbox:
            self.coroutines.add(model_id)

    def add_spawned(self) -> None:
        """Map the children a finish spawned, by their (unique) payloads."""
        found = []
        for backend, known in ((self.model, self.to_real), (self.real, self.to_model)):
            tasks = self.run(self.inspector(backend).list_tasks(TaskFilter(limit=1000)))
            found.append({json_key(t.payload): t for t in tasks if t.id not in known})
        model_new, real_new = found
        assert set(real_new) == set(model_new), f"spawned: {model_new} vs {real_new}"
        for task in sorted(model_new.values(), key=lambda t: t.id):
            note("finish: spawned a child")
            self.add_task(task.id, real_new[json_key(task.payload)].id, task.inbox)

    @rule(
        worker=st.sampled_from(WORKERS),
        limit=st.integers(1, 3),
        queues=st.sampled_from([QUEUES, QUEUES[:1], QUEUES[1:]]),
    )
    def claim(self, worker: str, limit: int, queues: tuple[str, ...]) -> None:
        # PostgreSQL claims keyed and plain tasks in turns, not merged in
        # claim order as the model does: while keyed tasks wait, a claim
        # there takes everything it may, and its order is not compared.
        merged = self.KIND != "postgres" or not self.keys_in_play()
        if not merged:
            note("claim: keyed tasks wait (everything claimed)")
            limit = EVERYTHING
        params = ClaimParams(
            worker_id=worker,
            names=[NAME],
            queues=list(queues),
            limit=limit,
            lease=LEASE,
            now=self.now,
        )
        self.causes |= RULE_CAUSES["claim"]
        model, real = self.model, self.real
        expected = self.run(model.claim(params))
        got = self.run(real.claim(params))
        assert len(expected) <= limit
        # Both come back in claim order: priority desc, run_at, id.
        claimed = self.fetch(c.token.task_id for c in expected)[0]
        order = [(-t.priority, t.run_at, t.id) for t in claimed.values()]
        assert order == sorted(order), f"model claim out of order: {order}"
        want = [claimed_view(c, c.token) for c in expected]
        have = [claimed_view(c, self.model_token(c.token)) for c in got]
        for c in got:
            self.nonces[self.model_token(c.token)] = c.token.nonce
        if not merged:
            have.sort(key=lambda claimed: want.index(claimed) if claimed in want else limit)
        assert have == want, f"claim({worker}, limit={limit}, {queues}) at {self.now}"
        for task in claimed.values():
            if task.attempt > 1 and task.attempts[-2].outcome is Outcome.LEASE_LOST:
                note("claim: reclaimed an expired lease")
        for c in expected:
            assert c.token.worker_id == worker
            self.handed.append(c.token)
            self.held[c.token] = None
            if c.token.task_id in self.coroutines:
                seen = self.inboxes(c.token.task_id)
                assert [message_view(m, self.real_model_id) for m in seen[1]] == [
                    message_view(m) for m in seen[0]
                ], f"inbox of {c.token} at claim"
                self.seen[c.token] = (tuple(m.id for m in seen[0]), tuple(m.id for m in seen[1]))
                if seen[0]:
                    note("claim: a coroutine with messages")

    @precondition(lambda self: self.handed)
    @rule(data=st.data())
    def heartbeat(self, data: st.DataObject) -> None:
        self.send_heartbeat(*self.draw_call(data))

    def send_heartbeat(self, worker: str, tokens: list[LeaseToken]) -> None:
        before = self.fetch(t.task_id for t in tokens)
        fresh = frozenset(t for t in tokens if live(before[0].get(t.task_id), t, worker, self.now))
        flagged = {t for t in fresh if before[0][t.task_id].cancel_requested}
        model, real = self.model, self.real
        expected = self.run(model.heartbeat(HeartbeatParams(worker, tokens, LEASE, self.now)))
        got = self.run(
            real.heartbeat(
                HeartbeatParams(worker, [self.real_token(t) for t in tokens], LEASE, self.now)
            )
        )
        note(f"heartbeat: {'renewed' if fresh else 'nothing renewed'}")
        if flagged:
            note("heartbeat: cancel requested")
        if any(t not in fresh and t.worker_id == worker for t in tokens):
            note("heartbeat: a stale token of this worker")
        # The model keeps the fence, and the real backend answers as the model does.
        assert (expected.renewed, expected.lost) == (fresh, frozenset(tokens) - fresh)
        assert expected.cancel_requested == flagged
        assert (
            self.model_tokens(got.renewed),
            self.model_tokens(got.lost),
            self.model_tokens(got.cancel_requested),
        ) == (expected.renewed, expected.lost, expected.cancel_requested), (
            f"heartbeat by {worker} of {tokens} at {self.now}"
        )
        # A renewal moves the lease and nothing else; a lost token changes nothing.
        after = self.fetch(before[0])
        renewed = {t.task_id for t in fresh}
        for snapshots, now_tasks in zip(before, after, strict=True):
            for task_id, task in snapshots.items():
                if task_id in renewed:
                    lease = task.lease or LEASE
                    task = replace(task, lease_expires_at=self.now + timedelta(seconds=lease))
                assert view(now_tasks[task_id]) == view(task), (
                    f"heartbeat by {worker} of {tokens} at {self.now}"
                )
        for token in tokens:
            if token not in fresh and token.worker_id == worker:
                self.held.pop(token, None)  # the worker learns it lost the lease

    @precondition(lambda self: self.handed)
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        worker, tokens = self.draw_call(data)
        completions = [self.draw_completion(data, token) for token in tokens]
        self.send_finish(worker, self.one_limit_per_key(completions))

    def one_limit_per_key(self, completions: list[Completion]) -> list[Completion]:
        """The completions, but of those that may make tasks of one
        concurrency key with different limits pending, only the first: which
        of them sets the key's limit follows the order a store applies its
        batch in, not the same on every backend (guarantees.md, Limits)."""
        rows = self.model._store.tasks  # type: ignore[attr-defined]
        limits: dict[str, int | None] = {}
        kept = []
        for c in completions:
            row = rows.get(c.token.task_id)
            key = row.concurrency_key if row is not None else None
            if key is not None and c.next_state in (TaskState.PENDING, TaskState.WAITING):
                limit = limits.setdefault(key, row.concurrency_limit)
                if limit != row.concurrency_limit:
                    note("finish: a second limit for one key left for a later call")
                    continue
            kept.append(c)
        return kept

    def send_finish(self, worker: str, completions: list[Completion]) -> None:
        tokens = [c.token for c in completions]
        before = self.fetch(t.task_id for t in tokens)
        fresh = frozenset(t for t in tokens if live(before[0].get(t.task_id), t, worker, self.now))
        self.causes |= RULE_CAUSES["finish"]
        model, real = self.model, self.real
        mail = {i: len(self.run(model.inbox(i))) for i in before[0]}
        expected = self.run(model.finish(FinishParams(worker, completions, self.now)))
        real_completions = [self.real_completion(c) for c in completions]
        got = self.run(real.finish(FinishParams(worker, real_completions, self.now)))
        if any(c.effects and c.effects.spawns for c in completions):
            self.add_spawned()
        assert (expected.applied, expected.rejected) == (fresh, frozenset(tokens) - fresh)
        assert (self.model_tokens(got.applied), self.model_tokens(got.rejected)) == (
            expected.applied,
            expected.rejected,
        ), f"finish by {worker} of {completions} at {self.now}"
        after = self.fetch(before[0])
        applied = {c.token.task_id: c for c in completions if c.token in fresh}
        note(f"finish: {'applied' if fresh else 'nothing applied'}")
        if any(t not in fresh and t.worker_id == worker for t in tokens):
            note("finish: a stale token of this worker")
        if any(before[0][i].cancel_requested for i in applied):
            note("finish: applied to a task whose cancel was requested")
        for snapshots, now_tasks in zip(before, after, strict=True):
            for task_id, task in snapshots.items():
                done = now_tasks[task_id]
                c = applied.get(task_id)
                # Another completion of this finish may have sent this task a
                # message (or its child's end) or cancelled its parent.
                mailed = len(self.run(model.inbox(task_id))) > mail[task_id]
                if c is None:  # every token for this task was rejected: nothing changed
                    assert self.unwoken(view(done), mailed, done) == self.unwoken(
                        view(task), mailed, done
                    ), f"rejected finish by {worker} of {completions} at {self.now}"
                    continue
                state = c.next_state
                if task.cancel_requested and state in (TaskState.PENDING, TaskState.WAITING):
                    state = TaskState.CANCELLED
                if state is TaskState.WAITING and self.run(model.inbox(task_id)):
                    state = TaskState.PENDING  # mail it did not consume: due again
                    note("finish: a resting poll left messages, due again")
                assert (done.state, done.attempt, done.attempts[-1].outcome) == (
                    state,
                    task.attempt,
                    c.outcome,
                )
        for token in tokens:
            if token.worker_id == worker:
                self.held.pop(token, None)

    @staticmethod
    def unwoken(seen: dict[str, Any], mailed: bool, task: Task) -> dict[str, Any]:
        """A view without what a message or a parent's cancel may change."""
        changeable = set()
        if mailed:
            changeable |= {"state", "run_at"}
        if task.parent_id is not None:
            changeable |= {"state", "finished_at", "cancel_requested"}
        return {k: v for k, v in seen.items() if k not in changeable}

    @precondition(lambda self: self.ids)
    @rule(data=st.data())
    def send(self, data: st.DataObject) -> None:
        """Messages from outside (app-level send) to 1-2 random tasks, all or nothing."""
        running = [t.task_id for t in self.held]
        pool = [*self.ids, *running, *self.coroutines, *self.coroutines, MISSING_ID]
        targets = data.draw(st.lists(st.sampled_from(pool), min_size=1, max_size=2))
        deliveries = []
        for target in targets:
            self.payloads += 1
            deliveries.append(Delivery(target, codec.encode({"outside": self.payloads})))
            if target in self.to_real:
                self.targets.add(target)
        self.send_messages(deliveries)

    def send_messages(self, deliveries: list[Delivery]) -> None:
        self.causes |= RULE_CAUSES["send"]
        model, real = self.model, self.real
        expected = self.outcome(lambda: model.send(SendParams(deliveries, now=self.now)))
        real_deliveries = [replace(d, task_id=self.real_id(d.task_id)) for d in deliveries]
        got = self.outcome(lambda: real.send(SendParams(real_deliveries, now=self.now)))
        note(f"send: {expected[0]} {expected[1] if expected[0] == 'raised' else ''}")
        if expected[0] == "returned":
            assert got[0] == "returned" and len(got[1]) == len(expected[1]), (  # type: ignore[arg-type]
                f"send({deliveries}) at {self.now}: {got}"
            )
        else:
            assert got == expected, f"send({deliveries}) at {self.now}"

    # Half-second steps up to three leases; short steps (within a lease) half the time.
    @rule(seconds=st.one_of(st.integers(0, 8), st.integers(0, 60)).map(lambda half: half / 2))
    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def crash(self, data: st.DataObject) -> None:
        holders = list(dict.fromkeys(t.worker_id for t in self.held))
        worker = data.draw(st.sampled_from(holders), label="crashed worker")
        for token in [t for t in self.held if t.worker_id == worker]:
            del self.held[token]

    @precondition(lambda self: self.ids)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        self.cancel_task(self.draw_task(data))

    def cancel_task(self, task_id: int) -> None:
        self.causes |= RULE_CAUSES["cancel"]
        model, real = self.model, self.real
        expected = self.outcome(lambda: model.cancel(task_id, now=self.now))
        note(f"cancel: {expected[0]} {expected[1]}")
        got = self.outcome(lambda: real.cancel(self.to_real.get(task_id, task_id), now=self.now))
        assert got == expected, f"cancel({task_id}) at {self.now}"

    @precondition(lambda self: self.ids)
    @rule(data=st.data())
    def retry(self, data: st.DataObject) -> None:
        self.retry_task(self.draw_task(data))

    def retry_task(self, task_id: int) -> None:
        self.causes |= RULE_CAUSES["retry"]
        model, real = self.model, self.real
        expected = self.outcome(lambda: model.retry(task_id, now=self.now))
        note(f"retry: {expected[0]} {expected[1]}")
        got = self.outcome(lambda: real.retry(self.to_real.get(task_id, task_id), now=self.now))
        assert got == expected, f"retry({task_id}) at {self.now}"

    @precondition(lambda self: self.ids)
    @rule(data=st.data(), action=st.sampled_from(["retry", "cancel"]))
    def bulk(self, data: st.DataObject, action: str) -> None:
        """A bulk retry or cancel of a few tasks by id (any order, missing
        ones too) and by state: every engine reads the filter in its own
        write, as the model does under its lock."""
        running = [t.task_id for t in self.held]
        pool = [*self.ids, *running, *self.pruned[-1:], MISSING_ID]
        ids = data.draw(st.lists(st.sampled_from(pool), max_size=4), label="ids")
        kind = RetryMany if action == "retry" else CancelMany
        allowed = sorted(kind.ALLOWED, key=lambda state: state.value)
        states = tuple(data.draw(st.lists(st.sampled_from(allowed), min_size=1, unique=True)))
        if action == "cancel":
            ids = self.apart(ids)
        self.bulk_action(action, states, ids)

    def apart(self, ids: list[int]) -> list[int]:
        """``ids`` without those that depend on an earlier one (directly or
        down a chain) or that an earlier one depends on: a bulk cancel of a
        dependency and its waiting dependent ends the dependent cancelled
        or by its policy, as the order the store applies it in has it (the
        model cancels one task after the other, PostgreSQL's statement all
        at once), so only one of them is cancelled in one call."""
        kept: list[int] = []
        for task_id in ids:
            related = self.upstream(task_id)
            if any(k in related or task_id in self.upstream(k) for k in kept):
                note("bulk cancel: a dependency and its dependent left for a later call")
                continue
            kept.append(task_id)
        return kept

    def upstream(self, task_id: int) -> set[int]:
        """The tasks ``task_id`` depends on, and theirs in turn (model ids)."""
        found: set[int] = set()
        todo = list(self.edges.get(task_id, ()))
        while todo:
            dependency = todo.pop()
            if dependency not in found:
                found.add(dependency)
                todo += self.edges.get(dependency, ())
        return found

    def bulk_action(self, action: str, states: tuple[TaskState, ...], ids: list[int]) -> None:
        self.causes |= RULE_CAUSES[action]
        model, real = self.model, self.real
        real_ids = [self.real_id(i) for i in ids]
        if action == "retry":
            expected = self.run(model.retry_many(RetryMany(states, ids=ids, now=self.now)))
            got = self.run(real.retry_many(RetryMany(states, ids=real_ids, now=self.now)))
        else:
            expected = self.run(model.cancel_many(CancelMany(states, ids=ids, now=self.now)))
            got = self.run(real.cancel_many(CancelMany(states, ids=real_ids, now=self.now)))
        note(f"{action}_many {[s.value for s in states]} of {ids}: {expected}")
        assert got == [self.real_id(i) for i in expected], f"{action}_many at {self.now}"

    @rule(what=st.sampled_from(PAUSABLE))
    def pause(self, what: tuple[PauseKind, str]) -> None:
        kind, name = what
        answers = [self.run(b.pause(kind, name, now=self.now)) for b in (self.model, self.real)]
        note(f"pause: {'paused' if answers[0] else 'paused already'}")
        assert answers[1] == answers[0], f"pause({kind}, {name}) at {self.now}"
        self.pauses_agree()

    @rule(what=st.sampled_from(PAUSABLE))
    def resume(self, what: tuple[PauseKind, str]) -> None:
        kind, name = what
        answers = [self.run(b.resume(kind, name)) for b in (self.model, self.real)]
        note(f"resume: {'resumed' if answers[0] else 'not paused'}")
        assert answers[1] == answers[0], f"resume({kind}, {name}) at {self.now}"
        self.pauses_agree()

    def pauses_agree(self) -> None:
        """Both backends list the same pauses (paused_at from the injected clock)."""
        listed = [
            [(p.kind, p.name, ms(p.paused_at)) for p in self.run(b.list_pauses())]
            for b in (self.model, self.real)
        ]
        assert listed[1] == listed[0], f"list_pauses at {self.now}"

    def keys_in_play(self) -> bool:
        """Whether the model has keyed tasks pending or running."""
        keys = self.run(self.inspector(self.model).list_keys(now=self.now))
        return any(k.pending or k.running for k in keys)

    @invariant()
    def keys_agree(self) -> None:
        """Both backends list the same flow-control keys: running limit,
        running and pending tasks, rate, tokens (to a millionth) and the
        next start a rate allows."""
        listed = [
            [
                (
                    k.key,
                    k.max_running,
                    k.running,
                    k.pending,
                    k.rate_limit,
                    k.rate_period,
                    None if k.tokens is None else round(k.tokens, 6),
                    ms(k.next_start_at),
                )
                for k in self.run(self.inspector(b).list_keys(now=self.now))
            ]
            for b in (self.model, self.real)
        ]
        assert listed[1] == listed[0], f"list_keys at {self.now}"
        if any(k[3] and k[2] >= k[1] for k in listed[0]):
            note("keys: a key at its running limit with tasks waiting")
        if any(k[6] is not None and k[6] < 1 for k in listed[0]):
            note("keys: a rate bucket empty")

    @precondition(lambda self: self.ids)
    @rule(
        cutoffs=st.lists(
            st.tuples(st.sampled_from(FINISHED), st.sampled_from(PRUNE_CUTOFFS)),
            min_size=1,
            max_size=3,
            unique_by=lambda cutoff: cutoff[0],
        ),
        limit=st.integers(0, 3),
    )
    def prune(self, cutoffs: list[tuple[TaskState, float]], limit: int) -> None:
        """Prune at most ``limit`` finished tasks, with a cutoff (seconds from
        the clock) for each state given, in that order; then forget them."""
        before = {state: self.now + timedelta(seconds=offset) for state, offset in cutoffs}
        if self.KIND == "redis" and self.batches_differ(before, limit):
            # Documented (RedisBackend.prune): within a state Redis prunes the
            # oldest finish first, the model (as the SQL backends) the lowest
            # id, so one batch may differ, never what a prune run to the end
            # deletes. Where this batch would, both prune everything.
            note("prune: Redis's batch (oldest finish first) differs, everything pruned")
            limit = EVERYTHING
        params = PruneParams(before=before, limit=limit)
        model, real = self.model, self.real
        counts = [self.run(self.inspector(b).count_prunable(params)) for b in (model, real)]
        assert counts[1] == counts[0], f"count_prunable({params}) at {self.now}"
        expected = self.run(model.prune(params))
        got = self.run(real.prune(params))
        assert got == expected, f"prune({params}) at {self.now}"
        assert expected.tasks == min(limit, counts[0].tasks), (expected, counts[0])
        gone = [i for i in self.ids if self.run(model.get_task(i)) is None]
        assert len(gone) == expected.tasks, f"model pruned {gone}: {expected}"
        note(f"prune: {'pruned' if gone else 'nothing pruned'}")
        self.pruned += gone
        self.ids = [i for i in self.ids if i not in gone]
        self.coroutines -= set(gone)
        # The real backend pruned the same tasks (fetch checks both), and
        # same_tasks_stored checks it pruned no other.
        assert self.fetch(gone) == ({}, {}), f"prune({params}) at {self.now}"

    def batches_differ(self, before: dict[TaskState, datetime], limit: int) -> bool:
        """Whether a prune batch of ``limit`` taken within each state by
        lowest id (the model) and by oldest finish, ids breaking ties
        (Redis), hold different tasks: read from the model's tasks."""
        tasks = self.fetch(self.ids)[0]
        alive = (TaskState.PENDING, TaskState.IN_PROGRESS, TaskState.WAITING)
        # A task an unfinished dependent waits for is kept.
        awaited = {
            dependency
            for dependent, dependencies in self.edges.items()
            if dependent in tasks and tasks[dependent].state in alive
            for dependency in dependencies
        }
        by_id: list[int] = []
        by_finish: list[int] = []
        for state, cutoff in before.items():
            found = [
                t
                for t in tasks.values()
                if t.state is state
                and t.finished_at is not None
                and t.finished_at < cutoff
                and not (t.parent_id in tasks and tasks[t.parent_id].state in alive)
                and t.id not in awaited
            ]
            by_id += sorted(t.id for t in found)
            by_finish += [t.id for t in sorted(found, key=lambda t: (t.finished_at, t.id))]
        return set(by_id[:limit]) != set(by_finish[:limit])

    @staticmethod
    def inspector(backend: Backend) -> Inspector:
        found = capability_of(backend, Capability.INSPECT)
        assert found is not None, f"{backend!r} has no read side"
        return found

    @rule(
        schedules=st.lists(SCHEDULES, min_size=1, max_size=2, unique_by=lambda s: s.name),
        tasks=st.lists(st.sampled_from(SCHEDULE_TASKS), max_size=2, unique=True),
        injected=st.sampled_from([True, True, False]),
    )
    def sync_schedules(
        self, schedules: list[StoredSchedule], tasks: list[str], injected: bool
    ) -> None:
        """Sync one or two schedules, dropping the stored ones of ``tasks``
        left out; not ``injected``: the stores stamp their own clock."""
        params = ScheduleSync(schedules, tasks, now=self.now if injected else None)
        applied = [self.run(b.sync_schedules(params)) for b in (self.model, self.real)]
        assert applied[1] == applied[0], f"sync_schedules({params}) at {self.now}"
        note(f"sync: {'applied' if applied[0] else 'superseded'}")
        self.schedules_agree(f"sync_schedules({params})")

    def schedules_agree(self, call: str) -> None:
        """Both backends list the same schedules, and read their own clocks."""
        (model_now, want), (real_now, have) = [
            self.run(b.list_schedules()) for b in (self.model, self.real)
        ]
        assert stamp(model_now) == stamp(real_now) == "real clock", (model_now, real_now)
        assert [schedule_view(s, self.real_model_id) for s in have] == [
            schedule_view(s) for s in want
        ], f"schedules after {call} at {self.now}"

    @precondition(lambda self: len(self.ids) < MAX_TASKS)
    @rule(
        name=st.sampled_from([*SCHEDULE_NAMES, "unknown"]),
        fingerprint=st.sampled_from([None, None, None, *(d.fingerprint for d in DEFINITIONS)]),
        slots=st.lists(
            st.tuples(st.sampled_from(SLOT_OFFSETS), SPECS),
            min_size=1,
            max_size=2,
            unique_by=lambda slot: slot[0],
        ),
    )
    def fire(self, name: str, fingerprint: str | None, slots: list[tuple[float, Spec]]) -> None:
        """Fire slots (seconds from the clock) of a schedule with ``fingerprint``
        (None: the stored one), one task per slot, due at a time of the
        machine's clock (not the store's), maybe keyed."""
        if fingerprint is None:
            stored = {s.name: s.fingerprint for s in self.run(self.model.list_schedules())[1]}
            fingerprint = stored.get(name, DEFINITIONS[0].fingerprint)
        slots = sorted(slots, key=lambda slot: slot[0])
        specs = [replace(spec, explicit_run_at=True) for _, spec in slots]
        at = [self.now + timedelta(seconds=offset) for offset, _ in slots]
        self.fire_tasks(FireParams(name, fingerprint, at, [self.new_task(s) for s in specs]))

    def fire_tasks(self, params: FireParams) -> None:
        fired = self.insert_both(f"fire({params})", lambda b: b.fire_schedule(params), params.tasks)
        note(f"fire: {'fired' if fired else 'nothing fired'}")
        self.schedules_agree(f"fire({params})")

    # -- invariants ----------------------------------------------------------

    @invariant()
    def tasks_agree(self) -> None:
        # Runs before work_agrees (Hypothesis runs invariants in name order;
        # replay() calls them in this order too).
        self.same_tasks_stored()
        model_tasks, real_tasks = self.fetch(self.ids)
        self.restamp(model_tasks, real_tasks)
        for task in model_tasks.values():
            check_shape(task, "model")
        for task in real_tasks.values():
            check_shape(task, self.KIND)
        self.moves_are_legal(model_tasks, real_tasks)
        want, have = self.views(model_tasks, real_tasks)
        for task_id in self.ids:
            assert have[task_id] == want[task_id], f"task {task_id} at {self.now}"

    def same_tasks_stored(self) -> None:
        """Both stores hold exactly the tasks the machine knows and did not
        prune; their summaries list the same tasks, with the same last errors."""
        errors = []
        for backend, numbering in ((self.model, None), (self.real, self.to_model)):
            listed = self.run(self.inspector(backend).list_tasks(TaskFilter(limit=1000)))
            stored = [t.id for t in listed]
            summaries = self.run(self.inspector(backend).list_summaries(TaskFilter(limit=1000)))
            assert [s.id for s in summaries] == stored, f"summaries of {backend!r} at {self.now}"
            number = numbering or {i: i for i in stored}
            errors.append({number.get(s.id): s.last_error for s in summaries})
            if numbering is not None:
                assert set(stored) <= set(numbering), f"{self.KIND} stores unknown tasks"
                stored = [numbering[i] for i in stored]
            assert sorted(stored) == sorted(self.ids), f"tasks stored in {backend!r} at {self.now}"
        assert errors[1] == errors[0], f"last errors at {self.now}"

    def moves_are_legal(self, model_tasks: dict[int, Task], real_tasks: dict[int, Task]) -> None:
        """Every task of both backends moved, since the last check, only by
        moves of the table that the rules run since may bring about. An
        enqueue that replaced a pending holder moved its run time, not the task."""
        causes = frozenset(self.causes)
        for kind, before, after in (
            ("model", self.seen_tasks[0], model_tasks),
            (self.KIND, self.seen_tasks[1], real_tasks),
        ):
            before = {
                i: replace(t, run_at=after[i].run_at)
                if i in self.replaced and t.state is TaskState.PENDING is after[i].state
                else t
                for i, t in before.items()
            }
            wrong = illegal_moves(before, after, causes)
            assert not wrong, f"{kind} moved tasks outside the state machine at {self.now}: {wrong}"
        for task_id, task in model_tasks.items():
            old = self.seen_tasks[0].get(task_id)
            if old is not None and old.state is not task.state:
                note(f"move: {old.state} -> {task.state}")
        self.seen_tasks = (model_tasks, real_tasks)
        self.causes.clear()
        self.replaced.clear()

    @invariant()
    def dependencies_agree(self) -> None:
        """Every task's dependencies read back alike from both backends
        (a dependent's ids in the order given, as the enqueue resolved them;
        none for any other task, a pruned dependent, or a dependent that met
        a held key), and a dependent still waiting waits for as many as it
        has edges not settled. Not without DEPENDENCIES (an engine may not
        read them yet)."""
        if not DEPENDENCIES:
            return
        model, real = self.model, self.real
        for task_id in dict.fromkeys([*self.edges, *self.ids]):
            dependencies = self.edges.get(task_id, ())
            want = [dependency_view(d) for d in self.run(model.dependencies(task_id))]
            have = [
                dependency_view(d, self.real_model_id)
                for d in self.run(real.dependencies(self.to_real[task_id]))
            ]
            assert have == want, f"dependencies of task {task_id} at {self.now}"
            if task_id in self.pruned or not dependencies:
                assert want == [], f"task {task_id} has dependencies {want}"
                continue
            assert [d[0] for d in want] == list(dependencies), f"task {task_id}: {want}"
            task = self.run(model.get_task(task_id, with_attempts=False))
            assert task is not None and task.waiting_for is not None, f"task {task_id}"
            if task.state is TaskState.WAITING:
                unsettled = sum(not d[-1] for d in want)
                assert task.waiting_for == unsettled > 0, f"task {task_id}: {task} {want}"
            if any(d[-1] for d in want):
                note("dependencies: an edge settled")
            if any(d[2] is None for d in want):
                note("dependencies: a dependency pruned")

    @invariant()
    def inboxes_agree(self) -> None:
        # Only coroutine tasks ever hold messages; the others are checked when sent one.
        for task_id in [*self.coroutines, *self.targets]:
            model_inbox, real_inbox = self.inboxes(task_id)
            want = ends_unordered([message_view(m) for m in model_inbox])
            have = ends_unordered([message_view(m, self.real_model_id) for m in real_inbox])
            assert have == want, f"inbox of task {task_id} at {self.now}"
            assert [m.task_id for m in model_inbox] == [task_id] * len(want)
            if any(m.kind is MessageKind.END for m in model_inbox):
                note("inbox: an end message")
        self.targets.clear()

    @invariant()
    def work_agrees(self) -> None:
        model, real = self.model, self.real
        work = WorkFilter(names=[NAME], queues=list(QUEUES), now=self.now)
        counts = [self.run(b.count_unfinished(work)) for b in (model, real)]
        assert counts[1] == counts[0], f"count_unfinished at {self.now}"
        due = [ms(self.run(b.next_due_at(list(QUEUES)))) for b in (model, real)]
        assert due[1] == due[0], f"next_due_at at {self.now}"


SETTINGS = settings(
    max_examples=EXAMPLES,
    stateful_step_count=40,
    deadline=None,
    database=None,
    derandomize=not FRESH_DRAWS,
    # No explain phase: its line tracing slows every run of a failing example
    # several times over, and shrinking would then outlast the test timeout.
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
    suppress_health_check=[HealthCheck.too_slow],
)


MACHINES: dict[str, type[BackendAgreement]] = {}


def machine_test_case(kind: str) -> type[unittest.TestCase]:
    """A TestCase running the machine against the ``kind`` backend."""

    @SETTINGS
    class Machine(BackendAgreement):
        KIND = kind

    Machine.__name__ = Machine.__qualname__ = f"{kind.capitalize()}Agreement"
    MACHINES[kind] = Machine
    case: type[unittest.TestCase] = Machine.TestCase
    # Not cut short by the default timeout while it shrinks a failure.
    return pytest.mark.timeout(FAILING_RUN_TIMEOUT)(case)


TestPostgres = machine_test_case("postgres")
TestSqlite = machine_test_case("sqlite")
TestRedis = machine_test_case("redis")


# -- replays of minimal disagreements the machine found ----------------------

REAL_BACKENDS = ["postgres", "sqlite", "redis"]


def replay(kind: str, *steps: Callable[[BackendAgreement], object]) -> None:
    """Run ``steps`` on a fresh machine, checking the invariants after each."""
    machine = MACHINES[kind]()
    try:
        for step in steps:
            step(machine)
            machine.dependencies_agree()
            machine.tasks_agree()
            machine.inboxes_agree()
            machine.work_agrees()
    finally:
        machine.teardown()


@pytest.mark.parametrize("kind", REAL_BACKENDS)
def test_replay_expired_leases_are_reclaimed_in_claim_order(kind: str) -> None:
    """Two expired leases, a claim with limit 1: the model takes the higher
    priority (claim order); a backend that first keeps the ``limit`` oldest
    expiries takes the one that expired first."""
    replay(
        kind,
        lambda m: m.enqueue([Spec(priority=0)], uniform=False),
        lambda m: m.claim("w1", limit=1, queues=QUEUES),  # task 1: lease until T0+10
        lambda m: m.advance(1.0),
        lambda m: m.enqueue([Spec(priority=2)], uniform=False),
        lambda m: m.claim("w1", limit=1, queues=QUEUES),  # task 2: lease until T0+11
        lambda m: m.advance(19.0),
        lambda m: m.claim("w2", limit=1, queues=QUEUES),  # the model reclaims task 2
    )


@pytest.mark.parametrize("kind", REAL_BACKENDS)
def test_replay_spent_leases_end_without_taking_claim_slots(kind: str) -> None:
    """Two leases expire together, one with its crash budget spent; a claim
    with limit 1 ends the spent one and reclaims the other (model). An
    expired task that is only ended must not use up the claim's limit."""
    replay(
        kind,
        lambda m: m.enqueue([Spec(max_attempts=1), Spec(max_attempts=2)], uniform=False),
        lambda m: m.claim("w1", limit=2, queues=QUEUES),
        lambda m: m.advance(LEASE),
        lambda m: m.claim("w1", limit=1, queues=QUEUES),
    )


@pytest.mark.parametrize("kind", REAL_BACKENDS)
def test_replay_heartbeat_reports_a_stale_token_lost_beside_its_successor(kind: str) -> None:
    """A worker's lease expires and the same worker reclaims the task; one
    heartbeat sends the stale token (attempt 1) with the current one (attempt
    2): only attempt 2 is renewed, attempt 1 is lost."""
    replay(
        kind,
        lambda m: m.enqueue([Spec()], uniform=False),
        lambda m: m.claim("w1", limit=1, queues=QUEUES),
        lambda m: m.advance(LEASE),
        lambda m: m.claim("w1", limit=1, queues=QUEUES),
        lambda m: m.send_heartbeat("w1", [LeaseToken(1, 1, "w1"), LeaseToken(1, 2, "w1")]),
    )


@pytest.mark.parametrize("kind", REAL_BACKENDS)
def test_replay_a_retry_that_ends_cancelled_keeps_its_run_at(kind: str) -> None:
    """A running task is cancelled, then its worker asks for a retry in 15 s:
    the task ends cancelled, and (model) its run_at stays where it was."""
    retry = Completion(
        LeaseToken(1, 1, "w1"),
        Outcome.FAILED,
        TaskState.PENDING,
        error=ERRORS[Outcome.FAILED],
        retry_delay=15.0,
    )
    replay(
        kind,
        lambda m: m.enqueue([Spec()], uniform=False),
        lambda m: m.claim("w1", limit=1, queues=QUEUES),
        lambda m: m.cancel_task(1),
        lambda m: m.send_finish("w1", [retry]),
    )


@pytest.mark.parametrize("kind", REAL_BACKENDS)
def test_replay_a_bulk_cancel_among_repeated_ids_cancels_a_task_once(kind: str) -> None:
    """A bulk cancel given one id twice answers it once (Redis's script
    took it twice)."""
    both = (TaskState.IN_PROGRESS, TaskState.PENDING)
    replay(
        kind,
        lambda m: m.enqueue([Spec()], uniform=False),
        lambda m: m.bulk_action("cancel", both, [1, 1]),
    )


@pytest.mark.parametrize("kind", REAL_BACKENDS)
def test_replay_created_at_follows_the_injected_clock(kind: str) -> None:
    """``now`` on EnqueueParams stamps created_at, as it does run_at."""

    def check(m: BackendAgreement) -> None:
        model, real = m.fetch(m.ids)
        assert ms(real[1].created_at) == ms(model[1].created_at) == ms(T0)

    replay(kind, lambda m: m.enqueue([Spec()], uniform=False), check)


@pytest.mark.parametrize("kind", REAL_BACKENDS)
def test_replay_a_first_message_does_not_wake_a_delayed_task(kind: str) -> None:
    """A coroutine task enqueued to run in 5 s with a first message: the
    message is its first input and does not move its start (the memory
    backend used to wake it as it does for any later message)."""
    replay(kind, lambda m: m.enqueue([Spec(delay=5.0, inbox=True, message=True)], uniform=False))


@pytest.mark.parametrize("kind", REAL_BACKENDS)
def test_replay_a_finishing_poll_s_message_to_itself_is_kept(kind: str) -> None:
    """A poll ends done and sends itself a message: its effects are written
    before its completion (the task is still running then), on every backend, so
    the message is stored in the finished task's inbox."""
    done = Completion(
        LeaseToken(1, 1, "w1"),
        Outcome.SUCCEEDED,
        TaskState.SUCCEEDED,
        result=codec.encode(None),
        effects=Effects(sends=(Delivery(1, codec.encode({"to": "self"}), 1),)),
    )
    replay(
        kind,
        lambda m: m.enqueue([Spec(inbox=True)], uniform=False),
        lambda m: m.claim("w1", limit=1, queues=QUEUES),
        lambda m: m.send_finish("w1", [done]),
    )


@pytest.mark.parametrize("kind", REAL_BACKENDS)
def test_replay_a_message_to_a_failing_poll_waits_out_its_backoff(kind: str) -> None:
    """One finish: task 2's poll fails (retry in 5 s) and task 1's poll sends
    task 2 a message. Effects go first, while task 2 still runs, so the
    message does not cut the retry's backoff short, whatever the order of
    the two completions in the batch."""
    failed = Completion(
        LeaseToken(2, 1, "w1"),
        Outcome.FAILED,
        TaskState.PENDING,
        error=ERRORS[Outcome.FAILED],
        retry_delay=5.0,
    )
    sent = Completion(
        LeaseToken(1, 1, "w1"),
        Outcome.SUCCEEDED,
        TaskState.SUCCEEDED,
        result=codec.encode(None),
        effects=Effects(sends=(Delivery(2, codec.encode({"to": 2}), 1),)),
    )
    replay(
        kind,
        lambda m: m.enqueue([Spec(inbox=True), Spec(inbox=True)], uniform=False),
        lambda m: m.claim("w1", limit=2, queues=QUEUES),
        lambda m: m.send_finish("w1", [failed, sent]),
    )


# Disagreements the machine found with pauses, unique keys and schedules.


def schedule_s1(m: BackendAgreement) -> None:
    m.sync_schedules([replace(DEFINITIONS[0], name="s1", task=NAME)], [NAME], injected=True)


def keyed(m: BackendAgreement, key: str, on_conflict: str = "existing") -> NewTask:
    """A task of the machine with unique key ``key``, due at the clock."""
    return m.new_task(Spec(key=key, on_conflict=on_conflict, explicit_run_at=True))


@pytest.mark.parametrize("kind", REAL_BACKENDS)
def test_replay_a_key_taken_over_keeps_its_place_in_the_batch(kind: str) -> None:
    """Task 1 holds k3 for 10 s; then one enqueue of a task with k3 and one
    without: every backend stores them in batch order (ids 2, 3; PostgreSQL
    once stored the unkeyed one first and the one taking k3 over after, so
    claim order among equals differed)."""
    replay(
        kind,
        lambda m: m.enqueue([Spec(key=PERIOD_KEY, period=10.0)], uniform=False),
        lambda m: m.advance(10.0),
        lambda m: m.enqueue_tasks([keyed(m, PERIOD_KEY), m.new_task(Spec())]),
    )


@pytest.mark.parametrize("kind", ["postgres", "redis"])
def test_replay_two_replaces_of_one_holder_in_a_batch(kind: str) -> None:
    """Task 1 holds k1; one enqueue of two tasks with k1 and ``replace``:
    task 1's payload is replaced twice, the last wins (PostgreSQL once
    applied either: one UPDATE ... FROM with two rows for one task)."""
    replay(
        kind,
        lambda m: m.enqueue([Spec(key="k1")], uniform=False),
        lambda m: m.enqueue_tasks([keyed(m, "k1", "replace"), keyed(m, "k1", "replace")]),
    )


@pytest.mark.parametrize("kind", ["postgres", "redis"])
@pytest.mark.parametrize("pause", [(PauseKind.QUEUE, QUEUES[0]), (PauseKind.TASK, NAME)])
def test_replay_a_pause_holds_back_an_expired_lease_s_end(
    kind: str, pause: tuple[PauseKind, str]
) -> None:
    """A task with a budget of one runs, its queue or name is paused, its
    lease expires, and a claim comes: it stays in progress until the resume
    (PostgreSQL's claim once ended it failed)."""
    replay(
        kind,
        lambda m: m.enqueue([Spec(max_attempts=1)], uniform=False),
        lambda m: m.claim("w1", limit=1, queues=QUEUES),
        lambda m: m.pause(pause),
        lambda m: m.advance(LEASE),
        lambda m: m.claim("w2", limit=1, queues=QUEUES),
    )


@pytest.mark.parametrize("kind", REAL_BACKENDS)
def test_replay_a_fire_that_meets_a_held_key_with_raise(kind: str) -> None:
    """Task 1 holds k1; a fire whose task has k1 and ``raise``: every backend
    raises TaskExistsError and fires nothing (the model once fired)."""
    replay(
        kind,
        schedule_s1,
        lambda m: m.enqueue([Spec(key="k1")], uniform=False),
        lambda m: m.fire_tasks(
            FireParams("s1", "f1", [T0 + timedelta(seconds=1)], [keyed(m, "k1", "raise")])
        ),
    )


@pytest.mark.parametrize("kind", REAL_BACKENDS)
def test_replay_a_key_repeated_in_a_fire_is_its_first_task(kind: str) -> None:
    """A fire of two slots whose tasks share k1, the second with ``replace``:
    the first task stays as it is (a key repeated in a batch is its first
    task; the model once gave it the second's payload)."""
    slots = [T0 + timedelta(seconds=1), T0 + timedelta(seconds=2)]
    replay(
        kind,
        schedule_s1,
        lambda m: m.fire_tasks(
            FireParams("s1", "f1", slots, [keyed(m, "k1"), keyed(m, "k1", "replace")])
        ),
    )


@pytest.mark.parametrize("kind", REAL_BACKENDS)
def test_replay_a_prune_batch_where_finish_order_is_not_id_order(kind: str) -> None:
    """Task 2 ends before task 1; a prune of one: the model (and the SQL
    backends) take the lowest id, Redis the oldest finish (documented), so
    on Redis the machine prunes everything instead (see prune)."""

    def done(task_id: int) -> Completion:
        token = LeaseToken(task_id, 1, "w1")
        return Completion(token, Outcome.SUCCEEDED, TaskState.SUCCEEDED, result=codec.encode(None))

    replay(
        kind,
        lambda m: m.enqueue([Spec(), Spec()], uniform=False),
        lambda m: m.claim("w1", limit=2, queues=QUEUES),
        lambda m: m.send_finish("w1", [done(2)]),
        lambda m: m.advance(1.0),
        lambda m: m.send_finish("w1", [done(1)]),
        lambda m: m.prune([(TaskState.SUCCEEDED, 1.0)], 1),
    )


@pytest.mark.parametrize("kind", REAL_BACKENDS)
def test_replay_a_prune_batch_takes_the_states_in_the_order_given(kind: str) -> None:
    """Task 1 is cancelled, then task 2 succeeds; a prune of one, the cutoff
    of succeeded tasks given first, takes task 2 (PostgreSQL once took the
    states in the order its grouping of the cutoffs came out in)."""
    done = Completion(
        LeaseToken(2, 1, "w1"), Outcome.SUCCEEDED, TaskState.SUCCEEDED, result=codec.encode(None)
    )
    replay(
        kind,
        lambda m: m.enqueue([Spec(), Spec()], uniform=False),
        lambda m: m.cancel_task(1),
        lambda m: m.claim("w1", limit=1, queues=QUEUES),
        lambda m: m.send_finish("w1", [done]),
        lambda m: m.advance(1.0),
        lambda m: m.prune([(TaskState.SUCCEEDED, 1.0), (TaskState.CANCELLED, 1.0)], 1),
    )


# Dependencies.


@pytest.mark.skipif(not DEPENDENCIES, reason="CONVEYOR_MACHINE_DEPENDENCIES=0")
@pytest.mark.parametrize("policy", AFTER_POLICIES)
@pytest.mark.parametrize("kind", REAL_BACKENDS)
def test_replay_a_chain_whose_middle_link_fails(kind: str, policy: str) -> None:
    """One enqueue of a chain 1 <- 2 <- 3, and 4 waiting for 1 and 3, each
    under ``policy``: 1 succeeds (2 is pending), 2 fails for good, so 3 ends
    cancelled (``cancel``) or failed (``fail``), and so in turn does 4; or
    (``run``) 3 is pending, runs and succeeds, and then 4 is pending too."""

    def chain(m: BackendAgreement) -> None:
        links = [(), (earlier(0),), (earlier(1),), (earlier(0), earlier(2))]
        m.enqueue_with_dependencies(
            [
                replace(m.new_task(Spec()), after=after, after_policy=policy, receives="results")
                if after
                else m.new_task(Spec())
                for after in links
            ]
        )

    def done(task_id: int) -> Completion:
        token = LeaseToken(task_id, 1, "w1")
        return Completion(token, Outcome.SUCCEEDED, TaskState.SUCCEEDED, result=codec.encode("ok"))

    failed = Completion(
        LeaseToken(2, 1, "w1"), Outcome.FAILED, TaskState.FAILED, error=ERRORS[Outcome.FAILED]
    )
    replay(
        kind,
        chain,
        lambda m: m.claim("w1", limit=3, queues=QUEUES),  # 1 only
        lambda m: m.send_finish("w1", [done(1)]),
        lambda m: m.claim("w1", limit=3, queues=QUEUES),  # 2 only
        lambda m: m.advance(1.0),
        lambda m: m.send_finish("w1", [failed]),
        lambda m: m.claim("w1", limit=3, queues=QUEUES),  # 3 under run, else nothing
        lambda m: m.send_finish("w1", [done(3)]),  # rejected unless 3 runs
        lambda m: m.claim("w1", limit=3, queues=QUEUES),  # 4 under run, else nothing
    )


@pytest.mark.skipif(not DEPENDENCIES, reason="CONVEYOR_MACHINE_DEPENDENCIES=0")
@pytest.mark.parametrize("policy", ["cancel", "run"])
@pytest.mark.parametrize("kind", REAL_BACKENDS)
def test_replay_a_cancel_reaching_a_child_moves_its_dependent(kind: str, policy: str) -> None:
    """Coroutine 1 suspends and spawns child 2 (due in 15 s); task 3 waits
    for 2; 5 s on, 1 is cancelled, which cancels 2, which ends 3 (``cancel``)
    or makes it pending, due now (``run``). The SQL triggers stamp the
    child's end with the real clock, and the dependent's times follow it
    (see ``restamp``)."""

    def suspend_and_spawn(m: BackendAgreement) -> None:
        rest = Completion(
            LeaseToken(1, 1, "w1"),
            Outcome.SUCCEEDED,
            TaskState.WAITING,
            transition=Transition(
                step=None,
                state=codec.encode({"rest_of": 1}),
                max_attempts=3,
                retry=RetryPolicy(max_attempts=3),
                lease=None,
                run_at=None,
                delay=0.0,
            ),
            effects=Effects(spawns=(m.new_task(Spec(delay=15.0), parent_id=1),)),
        )
        m.send_finish("w1", [rest])

    def dependent(m: BackendAgreement) -> None:
        task = replace(m.new_task(Spec()), after=(2,), after_policy=policy)
        m.enqueue_with_dependencies([task])

    replay(
        kind,
        lambda m: m.enqueue([Spec(inbox=True)], uniform=False),
        lambda m: m.claim("w1", limit=1, queues=QUEUES),
        suspend_and_spawn,
        dependent,
        lambda m: m.advance(5.0),
        lambda m: m.cancel_task(1),
    )


@pytest.mark.skipif(not DEPENDENCIES, reason="CONVEYOR_MACHINE_DEPENDENCIES=0")
@pytest.mark.parametrize("kind", REAL_BACKENDS)
def test_replay_a_claim_takes_the_dependent_its_own_sweep_released(kind: str) -> None:
    """Task 1 (a budget of one) runs and its worker crashes; task 2 waits
    for it (``run``). A claim of one after the lease ends task 1 failed,
    which makes task 2 pending, and hands task 2 out (PostgreSQL's claim
    once read the tasks as they stood before its own ends: it took none)."""

    def dependent(m: BackendAgreement) -> None:
        task = replace(m.new_task(Spec()), after=(1,), after_policy="run")
        m.enqueue_with_dependencies([task])

    replay(
        kind,
        lambda m: m.enqueue([Spec(max_attempts=1)], uniform=False),
        lambda m: m.claim("w1", limit=1, queues=QUEUES),
        dependent,
        lambda m: m.advance(LEASE),
        lambda m: m.claim("w2", limit=1, queues=QUEUES),
    )


@pytest.mark.skipif(not DEPENDENCIES, reason="CONVEYOR_MACHINE_DEPENDENCIES=0")
@pytest.mark.parametrize("kind", REAL_BACKENDS)
def test_replay_a_dependent_that_still_waits_keeps_its_pending_key(kind: str) -> None:
    """Task 1 is cancelled; one enqueue of task 3, waiting (``run``) for 1
    and 2 with k1 scoped ``pending``, and of a task with k1 (the batch's
    first with it answers): task 3 counts 1's end at once, still waits for
    2, and keeps k1 (PostgreSQL's trigger once gave the key up at the count,
    a write of the dependent's state that left it waiting)."""

    def batch(m: BackendAgreement) -> None:
        spec = Spec(key="k1", scope="pending", on_conflict="raise")
        keyed = replace(m.new_task(spec), after=(1, 2), after_policy="run")
        m.enqueue_with_dependencies([keyed, m.new_task(spec)])

    replay(
        kind,
        lambda m: m.enqueue([Spec(), Spec()], uniform=False),
        lambda m: m.cancel_task(1),
        batch,
    )


# -- the state machine check itself ----------------------------------------


def snapshot(state: TaskState, attempt: int = 0, **changes: Any) -> Task:
    """A task as a backend would show it, for the checks below."""
    return replace(
        Task(
            id=1,
            name=NAME,
            queue=QUEUES[0],
            payload={},
            state=state,
            priority=0,
            run_at=T0,
            attempt=attempt,
            max_attempts=3,
            retry=RetryPolicy(max_attempts=3),
            timeout=None,
            lease=None,
            result=None,
            created_at=T0,
            finished_at=None,
            worker_id=None,
            lease_expires_at=None,
            cancel_requested=False,
        ),
        **changes,
    )


S = TaskState


@pytest.mark.parametrize(
    ("before", "after", "rule"),
    [
        (snapshot(S.SUCCEEDED, 1), snapshot(S.PENDING, 1), "finish"),  # out of a terminal state
        (snapshot(S.PENDING), snapshot(S.WAITING), "finish"),  # no such move at all
        (None, snapshot(S.IN_PROGRESS, 1), "enqueue"),  # born running
        (snapshot(S.IN_PROGRESS, 1), snapshot(S.SUCCEEDED, 1), "claim"),  # a claim that succeeds
        (snapshot(S.FAILED, 1), snapshot(S.PENDING, 1), "cancel"),  # a cancel that retries
        (snapshot(S.PENDING), snapshot(S.IN_PROGRESS, 1), "heartbeat"),  # a heartbeat that claims
        (
            snapshot(S.IN_PROGRESS, 1),
            snapshot(S.IN_PROGRESS, 2),
            "finish",
        ),  # a finish that reclaims
        (snapshot(S.PENDING), snapshot(S.PENDING, run_at=T0 + timedelta(1)), "retry"),
        (snapshot(S.WAITING), snapshot(S.PENDING), "retry"),  # a retry ends no dependency
        (snapshot(S.WAITING), snapshot(S.FAILED), "heartbeat"),
    ],
)
def test_a_move_outside_the_table_fails_the_machine(
    before: Task | None, after: Task, rule: str
) -> None:
    """What ``moves_are_legal`` would report of a backend that moved a task so."""
    seen = {} if before is None else {1: before}
    assert illegal_moves(seen, {1: after}, RULE_CAUSES.get(rule, frozenset()))


@pytest.mark.parametrize(
    ("before", "after", "rule"),
    [
        (None, snapshot(S.PENDING), "enqueue"),
        (snapshot(S.PENDING), snapshot(S.IN_PROGRESS, 1), "claim"),
        (snapshot(S.IN_PROGRESS, 1), snapshot(S.IN_PROGRESS, 2), "claim"),  # a reclaim
        (snapshot(S.WAITING, 1), snapshot(S.IN_PROGRESS, 2), "claim"),  # woken, then claimed
        (snapshot(S.IN_PROGRESS, 1), snapshot(S.PENDING, 1), "finish"),  # suspended, then woken
        (None, snapshot(S.CANCELLED), "finish"),  # spawned, then its parent's cancel
        (snapshot(S.IN_PROGRESS, 1), snapshot(S.IN_PROGRESS, 1, cancel_requested=True), "cancel"),
        (snapshot(S.CANCELLED, 1), snapshot(S.PENDING, 1), "retry"),
        (snapshot(S.PENDING), snapshot(S.PENDING), "heartbeat"),  # nothing moved
        (None, snapshot(S.WAITING), "enqueue"),  # a dependent
        (None, snapshot(S.CANCELLED), "enqueue"),  # a dependency ended failed already
        (snapshot(S.WAITING), snapshot(S.FAILED), "claim"),  # a spent budget, policy fail
        (snapshot(S.WAITING), snapshot(S.PENDING), "finish"),  # its last dependency succeeded
        (snapshot(S.WAITING), snapshot(S.CANCELLED), "cancel"),  # itself, or a dependency
    ],
)
def test_chains_of_moves_of_the_table_pass(before: Task | None, after: Task, rule: str) -> None:
    seen = {} if before is None else {1: before}
    assert illegal_moves(seen, {1: after}, RULE_CAUSES.get(rule, frozenset())) == []
