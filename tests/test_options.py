"""Per-call options: one typed, frozen EnqueueOptions for every way of starting work."""

from __future__ import annotations

import dataclasses
import inspect
import sqlite3
import typing
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import conveyor
import conveyor.testing
from conveyor import EnqueueOptions, RetryPolicy, TaskContext
from conveyor.options import OPTIONS, TASK_DEFAULTS, OptionFields
from conveyor.task import TaskOptions

FIVE = RetryPolicy(max_attempts=5)


@pytest.fixture
def app(tmp_path: Path) -> Iterator[conveyor.App]:
    application = conveyor.App(f"sqlite:///{tmp_path / 'tasks.db'}")
    yield application
    application.close()


def _register(app: conveyor.App) -> tuple[conveyor.TaskDef, conveyor.Workflow, conveyor.Coroutine]:
    @app.task(queue="default", retry=RetryPolicy(max_attempts=2))
    def send_email(to: str, subject: str = "hi") -> str:
        return to

    flows = app.workflow("flow")

    @flows.step
    @dataclass
    class First:
        n: int

        async def run(self, ctx: TaskContext) -> conveyor.Done:
            return conveyor.done(self.n)

    @app.coroutine("echo")
    async def echo(poll: conveyor.Poll) -> conveyor.Suspend:
        return conveyor.suspend()

    return send_email, flows, echo


def _due_in(task: conveyor.Task) -> float:
    return (task.run_at - datetime.now(UTC)).total_seconds()


def test_a_task_takes_the_options_of_one_call_apart_from_its_payload(app: conveyor.App) -> None:
    send_email, _, _ = _register(app)
    handle = send_email.options(delay=60, queue="mail", priority=3, retry=FIVE).enqueue(
        to="ada@example.com"
    )
    task = handle.get()
    assert (task.queue, task.priority, task.max_attempts) == ("mail", 3, 5)
    assert task.payload == {"to": "ada@example.com"}
    assert 50 < _due_in(task) <= 60
    # The task's own defaults are untouched by a call's options.
    plain = send_email.enqueue(to="bob@example.com").get()
    assert (plain.queue, plain.priority, plain.max_attempts) == ("default", 0, 2)
    assert _due_in(plain) <= 1


def test_every_way_of_starting_work_names_the_valid_options_on_a_typo(app: conveyor.App) -> None:
    send_email, flows, echo = _register(app)
    starts: list[Any] = [
        lambda: send_email.options(dealy=60),
        lambda: app.enqueue_many(send_email, [{"to": "a"}], dealy=60),
        lambda: flows.start(flows.steps["First"].cls(n=1), dealy=60),
        lambda: echo.start({}, dealy=60),
        lambda: EnqueueOptions.of({"dealy": 60}),
    ]
    for start in starts:
        with pytest.raises(conveyor.ConfigurationError) as caught:
            start()
        assert "dealy" in str(caught.value)
        assert "delay" in str(caught.value) and "idempotency_key" in str(caught.value)
    assert app.list_tasks() == []


@pytest.mark.parametrize(
    "options",
    [
        {"queue": ""},
        {"priority": 2**40},
        {"priority": True},
        {"delay": -1},
        {"delay": 1, "run_at": datetime(2030, 1, 1, tzinfo=UTC)},
        {"run_at": datetime(2030, 1, 1)},
        {"retry": 5},
        {"timeout": 0},
        {"lease": 0.01},
        {"idempotency_key": ""},
    ],
)
def test_bad_option_values_are_refused_when_the_options_are_made(options: dict[str, Any]) -> None:
    with pytest.raises(conveyor.ConfigurationError):
        EnqueueOptions(**options)


def test_options_are_frozen_and_merge_later_over_earlier() -> None:
    base = EnqueueOptions(queue="mail", delay=timedelta(seconds=5))
    assert base.delay == 5.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        base.queue = "other"  # type: ignore[misc]
    later = base.merge(EnqueueOptions(run_at=datetime(2030, 1, 1, tzinfo=UTC), priority=2))
    assert (later.queue, later.delay, later.priority) == ("mail", None, 2)
    assert later.run_at == datetime(2030, 1, 1, tzinfo=UTC)


def test_bound_options_chain_and_enqueue_many_keys_each_task(app: conveyor.App) -> None:
    send_email, _, _ = _register(app)
    bound = send_email.options(queue="mail").options(priority=4, idempotency_key="batch")
    first = bound.enqueue_many([{"to": "a"}, {"to": "b"}])
    again = bound.enqueue_many([{"to": "a"}, {"to": "b"}])
    assert [h.id for h in first] == [h.id for h in again]
    tasks = [h.get() for h in first]
    assert [(t.queue, t.priority, t.idempotency_key) for t in tasks] == [
        ("mail", 4, "batch#0"),
        ("mail", 4, "batch#1"),
    ]


def test_workflows_and_coroutines_take_start_options_but_not_per_poll_ones(
    app: conveyor.App,
) -> None:
    _, flows, echo = _register(app)
    first = flows.steps["First"].cls
    handle = flows.options(queue="flows", delay=30).start(first(n=1))
    task = handle.get()
    assert (task.queue, task.step) == ("flows", "First")
    assert 20 < _due_in(task) <= 30
    started = echo.options(priority=7).start({"n": 1}, message={"hello": 1})
    assert started.get().priority == 7
    for refused in (
        lambda: flows.start(first(n=1), retry=FIVE),
        lambda: echo.start({}, lease=30),
        lambda: echo.options(timeout=5),
    ):
        with pytest.raises(conveyor.ConfigurationError, match="cannot be given here"):
            refused()


def test_app_enqueue_takes_an_options_object_with_keywords_on_top(app: conveyor.App) -> None:
    send_email, _, _ = _register(app)
    options = EnqueueOptions(queue="mail", priority=1)
    task = app.enqueue(send_email, {"to": "a"}, options=options, priority=9).get()
    assert (task.queue, task.priority) == ("mail", 9)


def test_a_bound_task_enqueues_inside_the_callers_transaction(
    app: conveyor.App, tmp_path: Path
) -> None:
    send_email, _, _ = _register(app)
    app.migrate()
    with sqlite3.connect(tmp_path / "tasks.db") as conn:
        send_email.options(connection=conn, queue="mail").enqueue(to="gone")
        conn.rollback()
        kept = send_email.options(connection=conn, queue="mail").enqueue(to="kept")
        conn.commit()
    conn.close()
    assert [t.id for t in app.list_tasks()] == [kept.id]


def test_a_poll_spawns_with_typed_options_and_refuses_unknown_ones() -> None:
    app = conveyor.App(f"memory://{uuid.uuid4().hex}")

    @app.task()
    def child(n: int) -> int:
        return n

    @app.coroutine("parent")
    async def parent(poll: conveyor.Poll) -> conveyor.Done | conveyor.Suspend:
        if poll.state.get("spawned"):
            return conveyor.done(poll.state["error"])
        try:
            poll.spawn(child, args={"n": 1}, colour="red")  # type: ignore[call-arg]
        except conveyor.ConfigurationError as exc:
            poll.state["error"] = str(exc)
        poll.spawn(child, args={"n": 2}, queue="kids", priority=5)
        poll.state["spawned"] = True
        return conveyor.suspend()

    with app:
        handle = parent.start({})
        conveyor.testing.drain(app, queues=["default"])
        [spawned] = [t for t in app.list_tasks() if t.name == "child"]
        assert (spawned.queue, spawned.priority, spawned.payload) == ("kids", 5, {"n": 2})
        conveyor.testing.drain(app, queues=["kids", "default"])
        assert "colour" in handle.result(timeout=10)


BAD_KEYS = {"empty": "", "nul": "a\x00b", "lone-surrogate": "user:\ud800", "huge": "k" * 100_000}


@pytest.mark.parametrize("key", BAD_KEYS.values(), ids=BAD_KEYS.keys())
@pytest.mark.parametrize(
    "make",
    [
        lambda key: conveyor.Unique(key=key),
        lambda key: conveyor.Concurrency(key=key),
        lambda key: conveyor.RateLimit(limit=1, per=1, key=key),
    ],
    ids=["unique", "concurrency", "rate"],
)
def test_every_kind_of_key_refuses_text_a_store_cannot_hold(
    app: conveyor.App, make: Any, key: str
) -> None:
    """Given as a value, the key is refused when the option is made; made by
    a function, when the task is enqueued, and nothing is stored."""
    with pytest.raises(conveyor.ConfigurationError, match="key"):
        make(key)
    send_email, _, _ = _register(app)
    option = make(lambda args: key)
    field = {"Unique": "unique", "Concurrency": "concurrency", "RateLimit": "rate"}
    bound = send_email.options(**{field[type(option).__name__]: option})
    with pytest.raises(conveyor.ConfigurationError, match="key function's result"):
        bound.enqueue(to="a")
    assert app.list_tasks() == []


def test_the_keyword_form_is_the_declaration_s_options_without_none() -> None:
    declared = typing.get_type_hints(EnqueueOptions)
    keywords = typing.get_type_hints(OptionFields)
    assert list(keywords) == [name for name, _ in OPTIONS] == list(declared)
    assert all(declared[name] == hint | None for name, hint in keywords.items())


def test_a_task_s_defaults_are_the_options_declared_as_such() -> None:
    declared = typing.get_type_hints(EnqueueOptions)
    defaults = typing.get_type_hints(TaskOptions)
    assert list(defaults) == list(TASK_DEFAULTS)
    assert all(declared[name] in (hint, hint | None) for name, hint in defaults.items())


def test_app_task_takes_a_task_s_defaults_as_keywords_of_the_same_types() -> None:
    fields = {f.name: f for f in dataclasses.fields(TaskOptions)}
    for form in [*typing.get_overloads(conveyor.App.task), conveyor.App.task]:
        keywords = inspect.signature(form).parameters.values()
        given = {p.name: p for p in keywords if p.kind is inspect.Parameter.KEYWORD_ONLY}
        if not given:
            continue  # a bare decorator's form: fn only
        assert [name for name in given if name in fields] == list(TASK_DEFAULTS)
        assert set(given) - set(fields) == {"name", "process"}
        for name, found in fields.items():
            assert given[name].annotation == found.type, name
            assert given[name].default == found.default, name


def test_conveyor_enqueue_has_a_flag_for_every_option_that_declares_one() -> None:
    from conveyor.cli.control import enqueue

    flags = {param.name: param.opts for param in enqueue.params}
    declared = {name: spec.flag.name for name, spec in OPTIONS if spec.flag is not None}
    assert declared
    assert all(flags[name] == [flag] for name, flag in declared.items())
