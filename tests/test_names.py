"""Task and queue names follow one rule everywhere, checked before any I/O:
1 to 200 printable characters (no newline or other control character, no
NUL, no lone surrogate), the rule of pauses and schedules. A name that
breaks it raises ConfigurationError and stores nothing, on every backend;
a worker never has to record a child task whose queue the store refuses."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.testclient import TestClient

import conveyor
from conveyor import ConfigurationError, Poll, RetryPolicy, TaskState, UnknownTaskError
from conveyor.dashboard import create_app
from conveyor.model import check_name, check_pause
from conveyor.records import TaskFilter
from conveyor.testing import drain_async

BAD_NAMES = {
    "empty": "",
    "nul": "a\x00b",
    "newline": "mail\nfake-log-line",
    "tab": "a\tb",
    "escape": "a\x1b[31mred",
    "surrogate": "a\ud800b",
    "long": "q" * 201,
    "10kb": "q" * 10_000,
}
GOOD_NAMES = ["default", "q" * 200, "mail.high-priority", "café ☕", "a b"]
BAD = pytest.mark.parametrize("bad", list(BAD_NAMES.values()), ids=list(BAD_NAMES))

FAST = RetryPolicy(max_attempts=1, initial_interval=0, max_interval=0, jitter=0)


def test_one_rule_for_every_kind_of_name() -> None:
    for name in GOOD_NAMES:
        assert check_name("queue", name) == name
        assert check_pause("queue", name)[1] == name
    for bad in BAD_NAMES.values():
        with pytest.raises(ConfigurationError, match="1 to 200 printable characters"):
            check_name("queue", bad)
        with pytest.raises(ConfigurationError, match="1 to 200 printable characters"):
            check_pause("queue", bad)
    with pytest.raises(ConfigurationError, match="not int"):
        check_name("queue", 7)


def test_the_error_shows_a_bad_name_on_one_short_line() -> None:
    with pytest.raises(ConfigurationError) as caught:
        check_name("queue", "x\n" * 50_000)
    assert "\n" not in str(caught.value)
    assert len(str(caught.value)) < 300


# -- registration (no store) -----------------------------------------------------


@BAD
def test_registration_refuses_a_bad_task_name_or_queue(bad: str) -> None:
    app = conveyor.App("memory://names")

    def handler() -> None:
        return None

    with pytest.raises(ConfigurationError):
        app.task(name=bad)(handler)
    with pytest.raises(ConfigurationError):
        app.task(name="fine", queue=bad)(handler)
    with pytest.raises(ConfigurationError):
        app.workflow(bad)
    with pytest.raises(ConfigurationError):
        app.workflow("flow", queue=bad)
    with pytest.raises(ConfigurationError):
        app.coroutine(bad)(_poll)
    with pytest.raises(ConfigurationError):
        app.coroutine("co", queue=bad)(_poll)
    assert not app.tasks


async def _poll(poll: Poll) -> Any:
    return conveyor.done(None)


@BAD
def test_a_worker_refuses_a_bad_queue_to_serve(bad: str) -> None:
    app = conveyor.App("memory://names")
    with pytest.raises(ConfigurationError):
        app.worker(queues=[bad])


@BAD
def test_filters_refuse_a_bad_name_or_queue(bad: str) -> None:
    with pytest.raises(ConfigurationError):
        TaskFilter(queue=bad)
    with pytest.raises(ConfigurationError):
        TaskFilter(name=bad)


# -- on every store ----------------------------------------------------------------


@pytest.fixture
def app(any_app: conveyor.App) -> conveyor.App:
    return any_app


@BAD
def test_an_enqueue_with_a_bad_name_or_queue_stores_nothing(app: conveyor.App, bad: str) -> None:
    @app.task(name="send")
    def send() -> None:
        return None

    with pytest.raises(ConfigurationError):
        app.enqueue(send, queue=bad)
    with pytest.raises(ConfigurationError):
        send.options(queue=bad).enqueue()
    with pytest.raises(ConfigurationError):
        app.enqueue_many(send, [{}, {}], queue=bad)
    with pytest.raises(UnknownTaskError):
        app.enqueue(bad)
    with pytest.raises(ConfigurationError):
        app.list_tasks(queue=bad)
    with pytest.raises(ConfigurationError):
        app.pause(queue=bad)
    app.allow_unregistered = True  # a producer that enqueues names handled elsewhere
    with pytest.raises(ConfigurationError):
        app.enqueue(bad)
    with pytest.raises(ConfigurationError):
        app.enqueue("elsewhere", queue=bad)
    task = send.new_tasks([{}])[0]
    task.queue = bad  # built by hand, around the checks of new_tasks
    with pytest.raises(ConfigurationError):
        app.enqueue_new([task])
    assert app.list_tasks() == []


async def test_a_poll_that_spawns_into_a_bad_queue_fails_alone(app: conveyor.App) -> None:
    """The child's queue is refused in the poll, before anything is written:
    the poll fails (its error names the queue), nothing is stored for the
    child, and the neighbours' completions go through."""

    @app.task(name="neighbour")
    async def neighbour(n: int) -> int:
        return n

    @app.coroutine("spawner", retry=FAST)
    async def spawner(poll: Poll) -> Any:
        poll.spawn(neighbour, args={"n": 0}, queue="q" * 6_400)
        return conveyor.suspend()

    async with app:
        parent = await spawner.start_async({})
        neighbours = [await neighbour.enqueue_async(n=n) for n in range(10)]
        await drain_async(app, concurrency=4)
        failed = await parent.get_async()
        done = [await h.get_async() for h in neighbours]
        stored = await app.list_tasks_async(limit=100)
    assert failed.state is TaskState.FAILED
    assert failed.attempts[-1].error_type == "conveyor.errors.ConfigurationError"
    assert "queue must be 1 to 200 printable" in (failed.attempts[-1].error_message or "")
    assert all(t.state is TaskState.SUCCEEDED for t in done)
    assert len(stored) == 11  # the parent and its neighbours: no child


async def test_a_workflow_start_refuses_a_bad_queue(app: conveyor.App) -> None:
    from dataclasses import dataclass

    flow = app.workflow("flow")

    @flow.step()
    @dataclass
    class First:
        async def run(self, ctx: conveyor.TaskContext) -> Any:
            return conveyor.done(None)

    async with app:
        with pytest.raises(ConfigurationError):
            await flow.start_async(First(), queue="a\nb")
        assert await app.list_tasks_async() == []


# -- the dashboard -------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["a\x00b", "q" * 201, "a\nb"], ids=["nul", "long", "newline"])
def test_the_dashboard_answers_400_to_a_bad_filter(bad: str) -> None:
    app = conveyor.App("memory://names-dashboard")
    with TestClient(create_app(app, allowed_hosts=["testserver"])) as client:
        for field in ("queue", "name"):
            page = client.get("/tasks", params={field: bad})
            assert page.status_code == 400, (field, page.status_code)
            assert "printable characters" in page.text
