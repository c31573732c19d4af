"""Step workflows run by a real worker, on every backend."""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass

import pytest

import conveyor
from conveyor import Outcome, RetryPolicy, TaskContext, TaskState
from conveyor.backends.params import EnqueueParams, FinishParams
from tests.worker.helpers import RunningWorker, listening, run_all, steal, wait_for

FAST = RetryPolicy(max_attempts=2, initial_interval=0.01, max_interval=0.01, jitter=0)


@pytest.fixture
def app(any_app: conveyor.App) -> conveyor.App:
    return any_app


def order_workflow(
    app: conveyor.App, seen: list[tuple[str, int, int]]
) -> tuple[conveyor.Workflow, type]:
    """An order workflow: Reserve, then (0.2 s later) Charge, which fails once, then ship."""
    orders = app.workflow("order")

    @orders.step(retry=FAST)
    @dataclass
    class Reserve:
        order_id: int

        async def run(self, ctx: TaskContext) -> conveyor.Next:
            seen.append((ctx.step or "", ctx.attempt, ctx.step_attempt))
            return conveyor.next(Charge(self.order_id, amount=5), delay=0.2)

    @orders.step(retry=FAST, timeout=5)
    @dataclass
    class Charge:
        order_id: int
        amount: int

        async def run(self, ctx: TaskContext) -> conveyor.Next:
            seen.append((ctx.step or "", ctx.attempt, ctx.step_attempt))
            if len([s for s in seen if s[0] == "Charge"]) == 1:
                raise ConnectionError("the card network blinked")
            return conveyor.next(Ship(self.order_id))

    @orders.step(name="ship")
    @dataclass
    class Ship:
        order_id: int

        async def run(self, ctx: TaskContext) -> conveyor.Done:
            seen.append((ctx.step or "", ctx.attempt, ctx.step_attempt))
            return conveyor.done({"shipped": self.order_id})

    return orders, Reserve


async def test_a_workflow_runs_its_steps_in_order_with_delays_and_retries(
    app: conveyor.App,
) -> None:
    seen: list[tuple[str, int, int]] = []
    orders, first = order_workflow(app, seen)
    async with app:
        handle = await orders.start_async(first(order_id=7))
        [task] = await run_all(app, [handle], poll_interval=0.05)
    assert task.state is TaskState.SUCCEEDED
    assert task.result == {"shipped": 7}
    assert task.step == "ship"
    # (step, lease token number, this step's attempt): the budget restarts per step.
    assert seen == [("Reserve", 1, 1), ("Charge", 2, 1), ("Charge", 3, 2), ("ship", 4, 1)]
    assert [(a.step, a.outcome) for a in task.attempts] == [
        ("Reserve", Outcome.SUCCEEDED),
        ("Charge", Outcome.FAILED),
        ("Charge", Outcome.SUCCEEDED),
        ("ship", Outcome.SUCCEEDED),
    ]
    # The delayed step did not start before its time.
    assert (task.attempts[1].started_at - task.attempts[0].finished_at).total_seconds() >= 0.19


async def test_a_step_whose_state_no_longer_decodes_fails_at_once_and_resumes_after_a_fix(
    app: conveyor.App,
) -> None:
    old = app.workflow("signup")

    @old.step
    @dataclass
    class Welcome:
        user: int

        async def run(self, ctx: TaskContext) -> conveyor.Done:
            return conveyor.done(f"welcomed {self.user}")

    async with app:
        handle = await old.start_async(Welcome(user=1))
        # The code changes between enqueue and run: the step now wants `email`.
        changed = conveyor.App(app.url, schema=_schema(app))
        new = changed.workflow("signup")

        @new.step(name="Welcome")
        @dataclass
        class WelcomeByMail:
            email: str

            async def run(self, ctx: TaskContext) -> conveyor.Done:
                return conveyor.done(f"mailed {self.email}")

        async with changed:
            [task] = await run_all(changed, [conveyor.TaskHandle(changed, handle.id)])
        assert task.state is TaskState.FAILED
        assert [a.outcome for a in task.attempts] == [Outcome.FAILED]  # not retried
        assert task.attempts[0].error_type == "conveyor.workflow.StepError"
        assert "no longer decodes" in (task.attempts[0].error_message or "")
        assert task.payload == {"user": 1}  # the stored state is kept

        # The fix is deployed (the original code here); a manual retry resumes.
        assert await app.retry_async(handle.id) is TaskState.PENDING
        [task] = await run_all(app, [handle])
    assert task.state is TaskState.SUCCEEDED
    assert task.result == "welcomed 1"
    assert [a.step for a in task.attempts] == ["Welcome", "Welcome"]


async def test_unknown_steps_and_wrong_returns_fail_without_retry(app: conveyor.App) -> None:
    flows = app.workflow("flow")

    @flows.step
    @dataclass
    class Confused:
        n: int

        async def run(self, ctx: TaskContext) -> object:
            return {"not": "a step outcome"}

    async with app:
        backend = await app.backend()
        wrong = await flows.start_async(Confused(n=1))
        new = flows.new_workflow(Confused(n=2))
        orphan_task = dataclasses.replace(new, step="Vanished")
        [orphan] = await backend.enqueue(EnqueueParams([orphan_task]))
        done = await run_all(app, [wrong, conveyor.TaskHandle(app, orphan)])
    assert [t.state for t in done] == [TaskState.FAILED, TaskState.FAILED]
    assert [len(t.attempts) for t in done] == [1, 1]
    assert "return conveyor.done" in (done[0].attempts[0].error_message or "")
    assert "no step 'Vanished'" in (done[1].attempts[0].error_message or "")


def test_steps_are_checked_at_registration_and_at_start(app: conveyor.App) -> None:
    flows = app.workflow("checked")
    with pytest.raises(conveyor.DuplicateTaskError):
        app.workflow("checked")

    with pytest.raises(conveyor.ConfigurationError, match="async def run"):

        @flows.step
        @dataclass
        class Blocking:
            def run(self, ctx: TaskContext) -> None:
                return None

    @dataclass
    class Stranger:
        async def run(self, ctx: TaskContext) -> conveyor.Done:
            return conveyor.done()

    with pytest.raises(conveyor.ConfigurationError, match="not a step"):
        flows.start(Stranger())


def _schema(app: conveyor.App) -> str | None:
    return app._backend_options.get("schema")


async def test_a_step_s_own_timeout_stops_it_and_its_retry_policy_applies(
    app: conveyor.App,
) -> None:
    flow = app.workflow("slow")
    runs: list[int] = []

    @flow.step(timeout=0.2, retry=FAST)
    @dataclass
    class Dawdle:
        n: int

        async def run(self, ctx: TaskContext) -> conveyor.Done:
            runs.append(ctx.step_attempt)
            if ctx.step_attempt == 1:
                await asyncio.sleep(30)  # stopped by the step's timeout
            return conveyor.done(self.n)

    async with app:
        [task] = await run_all(app, [await flow.start_async(Dawdle(n=3))])
    assert task.state is TaskState.SUCCEEDED and task.result == 3
    assert runs == [1, 2]
    assert [a.outcome for a in task.attempts] == [Outcome.TIMED_OUT, Outcome.SUCCEEDED]


async def test_a_step_that_lost_its_lease_cannot_move_the_workflow(app: conveyor.App) -> None:
    flow = app.workflow("contested")
    started, stopped = asyncio.Event(), asyncio.Event()

    @flow.step
    @dataclass
    class Hold:
        n: int

        async def run(self, ctx: TaskContext) -> conveyor.Next:
            started.set()
            try:
                await asyncio.sleep(60)
            finally:
                stopped.set()
            return conveyor.next(Never(self.n))

    @flow.step
    @dataclass
    class Never:
        n: int

        async def run(self, ctx: TaskContext) -> conveyor.Done:
            raise AssertionError("the victim's transition must not commit")

    async with app:
        handle = await flow.start_async(Hold(n=1))
        async with RunningWorker(app, lease=1.0, poll_interval=30) as worker:
            await asyncio.wait_for(started.wait(), 10)
            await wait_for(lambda: listening(worker), timeout=10)
            completion = await steal(app, handle.id, "thief")
            await asyncio.wait_for(stopped.wait(), 5)  # the victim was told, and stopped
        backend = await app.backend()
        assert (await backend.finish(FinishParams("thief", [completion]))).applied
        task = await handle.get_async()
    assert task.state is TaskState.SUCCEEDED and task.result == "thief"
    assert task.step == "Hold"  # no transition from the victim ever landed
    assert [(a.step, a.outcome, a.worker_id == "thief") for a in task.attempts] == [
        ("Hold", Outcome.LEASE_LOST, False),
        ("Hold", Outcome.SUCCEEDED, True),
    ]
