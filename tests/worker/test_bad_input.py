"""Bad input on every backend: a typed error at enqueue, or a failed attempt
with a readable error; the worker goes on and the task beside it succeeds.

Payloads at and one byte over the cap, values that are not strict JSON, rows
whose payload was corrupted around conveyor, names no worker has registered,
handlers that raise what no handler should (an exception whose ``str()``
raises, a 10 MB message, a cyclic chain of causes, ``SystemExit``,
``KeyboardInterrupt``) and handlers that return what JSON cannot hold.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import sqlite3
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote

import psycopg
import pytest

import conveyor
from conveyor import Outcome, RetryPolicy, TaskState
from conveyor.model import Task
from conveyor.worker.texts import MAX_ERROR_MESSAGE, MAX_TRACEBACK
from tests.conftest import PG_URL
from tests.worker.helpers import RunningWorker, wait_terminal

ONCE = RetryPolicy(max_attempts=1)
PAYLOAD_ERROR = "conveyor.errors.PayloadError"


@pytest.fixture
def app(any_app: conveyor.App) -> conveyor.App:
    """Every test here that touches a store runs on each backend."""
    return any_app


async def run_beside_a_good_task(
    app: conveyor.App, bad: list[conveyor.TaskHandle]
) -> tuple[list[Task], Task]:
    """Run ``bad`` with a good task enqueued alongside; once all have ended,
    the same worker (still running) must run one more good task."""

    @app.task(name="good")
    async def good(n: int) -> int:
        return n

    beside = await good.enqueue_async(n=1)
    runner = RunningWorker(app)
    async with runner:
        tasks = await wait_terminal(app, [h.id for h in bad] + [beside.id])
        after = await good.enqueue_async(n=2)
        [later] = await wait_terminal(app, [after.id])
        assert runner._task is not None and not runner._task.done()
    *ended, alongside = tasks
    assert (alongside.state, alongside.result) == (TaskState.SUCCEEDED, 1)
    assert (later.state, later.result) == (TaskState.SUCCEEDED, 2)
    return ended, alongside


def only_attempt(task: Task) -> conveyor.Attempt:
    assert task.state is TaskState.FAILED
    [attempt] = task.attempts
    assert attempt.outcome is Outcome.FAILED
    return attempt


# ---------------------------------------------------------------------------
# The size cap, on the way in (enqueue) and on the way out (a result).
# ---------------------------------------------------------------------------


async def test_payload_at_the_cap_runs_and_one_byte_over_is_refused(app: conveyor.App) -> None:
    @app.task()
    async def carry(s: str) -> int:
        return len(s)

    cap = app.max_payload_bytes
    room = cap - len('{"s":""}')
    with pytest.raises(conveyor.PayloadTooLargeError) as refused:
        await carry.enqueue_async(s="x" * (room + 1))
    assert (refused.value.size, refused.value.limit) == (cap + 1, cap)
    assert not app._backends  # refused before any I/O

    async with app:
        [task], _ = await run_beside_a_good_task(app, [await carry.enqueue_async(s="x" * room)])
    assert (task.state, task.result) == (TaskState.SUCCEEDED, room)
    assert task.payload == {"s": "x" * room}


async def test_result_at_the_cap_is_stored_and_one_byte_over_fails_the_attempt(
    app: conveyor.App,
) -> None:
    @app.task(retry=ONCE)
    async def sized(n: int) -> str:
        return "x" * n

    cap = app.max_payload_bytes  # a string result encodes as its text and two quotes
    async with app:
        handles = [await sized.enqueue_async(n=n) for n in (cap - 2, cap - 1)]
        (at_cap, over), _ = await run_beside_a_good_task(app, handles)
    assert (at_cap.state, at_cap.result) == (TaskState.SUCCEEDED, "x" * (cap - 2))
    attempt = only_attempt(over)
    assert attempt.error_type == PAYLOAD_ERROR
    assert attempt.error_message == (
        f"the result is not stored: payload is {cap + 1} bytes encoded; the limit is {cap} bytes"
    )


# ---------------------------------------------------------------------------
# Values that are not strict JSON: refused at enqueue, before any I/O.
# ---------------------------------------------------------------------------


def _nested(depth: int) -> object:
    value: object = 0
    for _ in range(depth):
        value = [value]
    return value


def _cyclic() -> object:
    loop: list[object] = []
    loop.append(loop)
    return loop


NOT_STRICT_JSON = {
    "nan": (math.nan, "not strict JSON"),
    "infinity": (math.inf, "not strict JSON"),
    "minus-infinity": (-math.inf, "not strict JSON"),
    "nul": ("a\x00b", "NUL"),
    "lone-surrogate": ("\ud800", "lone surrogate"),
    "int-key": ({1: "a"}, "keys must be strings, not int"),
    "tuple-key": ({(1, 2): 1}, "keys must be strings, not tuple"),
    "none-key": ({None: 1}, "keys must be strings, not NoneType"),
    "bool-key": ({True: 1}, "keys must be strings, not bool"),
    "deep-nesting": (_nested(1000), "nesting is deeper than 64 levels"),
    "cycle": (_cyclic(), "nesting is deeper than 64 levels"),
    "set": ({1, 2}, "set is not a JSON type"),
    "bytes": (b"raw", "bytes is not a JSON type"),
    "object": (object(), "object is not a JSON type"),
}


@pytest.mark.parametrize(("value", "fragment"), NOT_STRICT_JSON.values(), ids=NOT_STRICT_JSON)
async def test_enqueue_refuses_a_value_that_is_not_strict_json(
    app: conveyor.App, value: object, fragment: str
) -> None:
    @app.task()
    async def take(x: object) -> None:
        return None

    with pytest.raises(conveyor.PayloadError, match=fragment):
        await take.enqueue_async(x=value)
    with pytest.raises(conveyor.PayloadError, match=fragment):
        await app.enqueue_many_async(take, [{"x": 1}, {"x": value}])
    assert not app._backends


async def test_a_bad_payload_deep_in_a_large_batch_stores_nothing(app: conveyor.App) -> None:
    """Past its first chunk, a large batch is checked while earlier chunks are
    being inserted, in one transaction: a bad payload there rolls them back."""
    from conveyor.client import ENQUEUE_CHUNK

    @app.task()
    async def take(x: object) -> None:
        return None

    payloads: list[dict[str, object]] = [{"x": n} for n in range(ENQUEUE_CHUNK * 2 + 500)]
    payloads[-1] = {"x": float("nan")}
    with pytest.raises(conveyor.PayloadError, match="not strict JSON"):
        await app.enqueue_many_async(take, payloads)
    assert await app.list_tasks_async(limit=10) == []
    handles = await app.enqueue_many_async(take, payloads[:-1])
    assert [h.id for h in handles] == sorted(h.id for h in handles)
    assert len(set(h.id for h in handles)) == len(payloads) - 1
    listed = await app.list_tasks_async(limit=len(payloads))
    assert sorted(t.payload["x"] for t in listed) == list(range(len(payloads) - 1))


@pytest.mark.parametrize(
    "args",
    [{1: "a"}, {(1, 2): 1}, {None: 1}, {"x": 1, 2: "b"}],
    ids=["int", "tuple", "none", "mixed"],
)
async def test_enqueue_refuses_argument_names_that_are_not_strings(
    app: conveyor.App, args: dict[Any, Any]
) -> None:
    @app.task()
    async def closed(x: int = 0) -> None:
        return None

    @app.task()
    async def open_ended(**anything: object) -> None:
        return None

    for task in (closed, open_ended):
        with pytest.raises(conveyor.PayloadError, match="must be strings, not"):
            await app.enqueue_async(task, args)
    assert not app._backends


async def test_enqueue_of_an_unknown_name_is_refused(app: conveyor.App) -> None:
    with pytest.raises(conveyor.UnknownTaskError, match="no task named 'nowhere'"):
        await app.enqueue_async("nowhere", {})
    assert not app._backends


async def test_a_worker_leaves_a_name_it_has_not_registered_pending(app: conveyor.App) -> None:
    app.allow_unregistered = True  # a producer-only app enqueues for other workers
    async with app:
        elsewhere = await app.enqueue_async("handled_elsewhere", {"x": 1})
        await run_beside_a_good_task(app, [])
        task = await elsewhere.get_async()
    assert task is not None
    assert (task.state, task.attempts) == (TaskState.PENDING, ())


# ---------------------------------------------------------------------------
# A stored payload corrupted around conveyor.
# ---------------------------------------------------------------------------


async def corrupt_payload(app: conveyor.App, task_id: int, text: str) -> None:
    """Overwrite a task's stored payload as a careless script would."""
    backend: Any = await app.backend()
    if app.url.startswith("postgresql"):
        async with backend.pool.connection() as conn:
            statement = psycopg.sql.SQL("update {} set payload = %s::jsonb where id = %s")
            await conn.execute(
                statement.format(psycopg.sql.Identifier(backend.schema, "tasks")), (text, task_id)
            )
    elif app.url.startswith("sqlite"):

        def write() -> None:
            with contextlib.closing(sqlite3.connect(backend.path)) as conn, conn:
                conn.execute("update conveyor_tasks set payload = ? where id = ?", (text, task_id))

        await asyncio.to_thread(write)
    elif app.url.startswith("redis"):
        await backend._redis.hset(f"{{{backend.prefix}}}:task:{task_id}", "payload", text)
    else:
        with backend._store.lock:
            backend._store.tasks[task_id].payload = text


DEEP = '{"x": ' + "[" * 5000 + "]" * 5000 + "}"
DEFAULT_RECURSION_LIMIT = 1000


@pytest.fixture
def default_recursion_limit() -> Iterator[None]:
    """How deep Python's decoder goes is its recursion limit, which libraries
    loaded by earlier tests (Hypothesis, the docs tools) may have raised."""
    saved = sys.getrecursionlimit()
    sys.setrecursionlimit(DEFAULT_RECURSION_LIMIT)
    yield
    sys.setrecursionlimit(saved)


CORRUPT = {
    "not-an-object": ("[1, 2]", "the stored payload is not a JSON object", True),
    "unknown-argument": ('{"y": 1}', "does not fit task 'job': unexpected argument: y", True),
    "too-deep-to-decode": (DEEP, "stored JSON does not decode: maximum recursion depth", True),
    "not-json": ("{not json", "stored JSON does not decode", False),
    "nan": ('{"x": NaN}', "stored JSON does not decode: NaN is not strict JSON", False),
}


@pytest.mark.parametrize(
    ("text", "fragment", "jsonb_holds_it"), CORRUPT.values(), ids=list(CORRUPT)
)
async def test_a_corrupt_stored_payload_fails_its_task_at_once(
    app: conveyor.App,
    text: str,
    fragment: str,
    jsonb_holds_it: bool,
    default_recursion_limit: None,
) -> None:
    if app.url.startswith("postgresql") and not jsonb_holds_it:
        pytest.skip("PostgreSQL's jsonb holds valid JSON only")

    @app.task(retry=RetryPolicy(max_attempts=5))
    async def job(x: int = 0) -> int:
        return x

    async with app:
        handle = await job.enqueue_async(x=1)
        await corrupt_payload(app, handle.id, text)
        [task], _ = await run_beside_a_good_task(app, [handle])
        listed = await app.list_tasks_async()
    attempt = only_attempt(task)  # no retry can fix the payload
    assert attempt.error_type == PAYLOAD_ERROR
    assert fragment in (attempt.error_message or "")
    assert {t.id for t in listed} >= {handle.id}  # one bad row does not break a listing
    if not jsonb_holds_it:
        assert task.payload == text  # what does not decode is shown as stored


# ---------------------------------------------------------------------------
# Handlers that raise what no handler should.
# ---------------------------------------------------------------------------


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("str() fails")


class Unrepresentable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("str() fails")

    def __repr__(self) -> str:
        raise RuntimeError("repr() fails")


class Peculiar(BaseException):
    """Neither an Exception nor one of the exits: still just a failure."""


def _cyclic_causes() -> BaseException:
    first, second = ValueError("first"), RuntimeError("second")
    first.__cause__, second.__cause__ = second, first
    return first


def _cyclic_contexts() -> BaseException:
    first, second = ValueError("first"), RuntimeError("second")
    first.__context__, second.__context__ = second, first
    return first


def _own_cause() -> BaseException:
    error = ValueError("first")
    error.__cause__ = error
    return error


HERE = __name__
TEN_MB = 10_000_000
CUT = f"... [{TEN_MB - MAX_ERROR_MESSAGE + 40} characters cut]"
RAISED: dict[str, tuple[Callable[[], BaseException], str, str]] = {
    # name: (the exception, its stored error_type, its stored error_message)
    "str-raises": (lambda: Unprintable("x"), f"{HERE}.Unprintable", "Unprintable('x')"),
    "str-and-repr-raise": (
        lambda: Unrepresentable("x"),
        f"{HERE}.Unrepresentable",
        "<Unrepresentable whose str() and repr() raise>",
    ),
    "10-mb-message": (
        lambda: ValueError("x" * TEN_MB),
        "ValueError",
        "x" * (MAX_ERROR_MESSAGE - 40) + CUT,
    ),
    "cyclic-causes": (_cyclic_causes, "ValueError", "first"),
    "cyclic-contexts": (_cyclic_contexts, "ValueError", "first"),
    "own-cause": (_own_cause, "ValueError", "first"),
    "nul-in-message": (lambda: ValueError("bad\x00byte"), "ValueError", "bad\\x00byte"),
    "surrogate-in-message": (lambda: ValueError("/d/\udcff.csv"), "ValueError", "/d/\\udcff.csv"),
    "system-exit": (lambda: SystemExit(3), "SystemExit", "3"),
    "keyboard-interrupt": (lambda: KeyboardInterrupt("stop"), "KeyboardInterrupt", "stop"),
    "base-exception": (lambda: Peculiar("odd"), f"{HERE}.Peculiar", "odd"),
}


def register_raisers(app: conveyor.App, executor: str) -> dict[str, conveyor.TaskDef]:
    """One task per entry of RAISED, ``async def`` or plain ``def`` (a thread)."""
    tasks = {}
    for name, (make, _, _) in RAISED.items():
        if executor == "async":

            async def raise_async(make: Callable[[], BaseException] = make) -> None:
                raise make()

            handler: Callable[..., Any] = raise_async
        else:

            def raise_in_thread(make: Callable[[], BaseException] = make) -> None:
                raise make()

            handler = raise_in_thread
        tasks[name] = app.task(name=f"raise_{name}", retry=ONCE)(handler)
    return tasks


@pytest.mark.parametrize("executor", ["async", "thread"])
async def test_handlers_that_raise_anything_fail_with_a_readable_error(
    app: conveyor.App, executor: str
) -> None:
    tasks = register_raisers(app, executor)
    async with app:
        handles = [await task.enqueue_async() for task in tasks.values()]
        ended, _ = await run_beside_a_good_task(app, handles)
    stored = {name: only_attempt(task) for name, task in zip(RAISED, ended, strict=True)}
    for name, (_, error_type, message) in RAISED.items():
        attempt = stored[name]
        assert (attempt.error_type, attempt.error_message) == (error_type, message), name
        assert attempt.traceback and len(attempt.traceback) <= MAX_TRACEBACK, name
    assert len(stored["10-mb-message"].error_message or "") <= MAX_ERROR_MESSAGE
    assert "characters cut]" in (stored["10-mb-message"].traceback or "")
    for name in ("cyclic-causes", "cyclic-contexts"):
        trace = stored[name].traceback or ""
        assert "ValueError: first" in trace and "RuntimeError: second" in trace, name


# ---------------------------------------------------------------------------
# Handlers that return what JSON cannot hold.
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class Locked:
    lock: Any


NOT_JSON_RESULTS: dict[str, tuple[Callable[[], object], str]] = {
    "object": (object, "object is not a JSON type"),
    "set": (lambda: {1, 2}, "set is not a JSON type"),
    "bytes": (lambda: b"raw", "bytes is not a JSON type"),
    "nan": (lambda: math.nan, "not strict JSON"),
    "infinity": (lambda: {"x": math.inf}, "not strict JSON"),
    "int-key": (lambda: {1: "a"}, "object keys must be strings, not int"),
    "nul": (lambda: "a\x00b", "NUL"),
    "lone-surrogate": (lambda: "\ud800", "lone surrogate"),
    "deep-nesting": (lambda: _nested(1000), "nesting is deeper than 64 levels"),
    "cycle": (_cyclic, "nesting is deeper than 64 levels"),
    "uncopyable-dataclass": (
        lambda: Locked(threading.Lock()),
        "Locked does not convert to JSON: cannot pickle",
    ),
}


def register_returners(app: conveyor.App, executor: str) -> list[conveyor.TaskDef]:
    tasks = []
    for name, (make, _) in NOT_JSON_RESULTS.items():
        if executor == "async":

            async def return_async(make: Callable[[], object] = make) -> object:
                return make()

            handler: Callable[..., Any] = return_async
        else:

            def return_in_thread(make: Callable[[], object] = make) -> object:
                return make()

            handler = return_in_thread
        tasks.append(app.task(name=f"return_{name}", retry=ONCE)(handler))
    return tasks


@pytest.mark.parametrize("executor", ["async", "thread"])
async def test_handlers_that_return_what_json_cannot_hold_fail_the_attempt(
    app: conveyor.App, executor: str
) -> None:
    tasks = register_returners(app, executor)
    async with app:
        handles = [await task.enqueue_async() for task in tasks]
        ended, _ = await run_beside_a_good_task(app, handles)
    for (name, (_, fragment)), task in zip(NOT_JSON_RESULTS.items(), ended, strict=True):
        attempt = only_attempt(task)
        assert attempt.error_type == PAYLOAD_ERROR, name
        message = attempt.error_message or ""
        assert message.startswith("the result is not stored: ") and fragment in message, name


# ---------------------------------------------------------------------------
# The PostgreSQL schema name: validated however it is given.
# ---------------------------------------------------------------------------

BAD_SCHEMAS = ["bad; drop table x", "Upper", "1abc", "a-b", "a" * 41, "", 'x"y']


@pytest.mark.parametrize("name", BAD_SCHEMAS)
def test_a_bad_schema_name_is_refused_however_it_is_given(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(conveyor.ConfigurationError, match="invalid schema name"):
        conveyor.App(PG_URL, schema=name)
    if not name:
        return  # an empty ?schema= or CONVEYOR_SCHEMA means "not set"
    with pytest.raises(conveyor.ConfigurationError, match="invalid schema name"):
        conveyor.App(f"{PG_URL}?schema={quote(name)}")
    monkeypatch.setenv("CONVEYOR_SCHEMA", name)
    with pytest.raises(conveyor.ConfigurationError, match="invalid schema name"):
        conveyor.App(PG_URL)
