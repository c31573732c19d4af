"""Registration and payload binding, checked before any I/O."""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import re
import subprocess
import sys
import threading
import typing
import uuid
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any
from uuid import UUID

import pydantic
import pytest
from typing_extensions import TypedDict

import conveyor
from conveyor import TaskContext

URL = "postgresql://127.0.0.1:5432/test"


@pytest.fixture
def offline_app() -> conveyor.App:
    return conveyor.App(URL)  # nothing connects until a backend is used


def test_payload_keys_must_match_the_handler(offline_app: conveyor.App) -> None:
    @offline_app.task()
    def send(ctx: TaskContext, to: str, subject: str = "hi") -> None:
        return None

    assert send.encode_args({"to": "a"}, 1000) == '{"to":"a"}'
    with pytest.raises(conveyor.PayloadError, match="missing a required argument: to"):
        send.encode_args({"subject": "x"}, 1000)
    with pytest.raises(conveyor.PayloadError, match="unexpected argument: cc"):
        send.encode_args({"to": "a", "cc": "b"}, 1000)
    with pytest.raises(conveyor.PayloadError, match="context"):
        send.encode_args({"to": "a", "ctx": 1}, 1000)


def test_var_keyword_handlers_take_any_keys(offline_app: conveyor.App) -> None:
    @offline_app.task()
    def anything(**fields: Any) -> None:
        return None

    assert anything.encode_args({"x": 1, "y": [2]}, 1000) == '{"x":1,"y":[2]}'


def test_positional_only_parameters_are_refused_at_registration(
    offline_app: conveyor.App,
) -> None:
    def positional(a: int, /) -> None:
        return None

    with pytest.raises(conveyor.ConfigurationError, match="positional-only"):
        offline_app.task(positional)


def test_executor_follows_the_handler_kind(offline_app: conveyor.App) -> None:
    @offline_app.task()
    async def coro() -> None:
        return None

    @offline_app.task()
    def plain() -> None:
        return None

    @offline_app.task(process=True)
    def cpu() -> None:
        return None

    assert (coro.executor, plain.executor, cpu.executor) == ("async", "thread", "process")
    with pytest.raises(conveyor.ConfigurationError, match="TaskContext"):
        offline_app.task(name="ctx_in_process", process=True)(_takes_context)


def _takes_context(ctx: TaskContext) -> None:
    return None


def test_invalid_options_are_refused(offline_app: conveyor.App) -> None:
    with pytest.raises(conveyor.ConfigurationError):
        offline_app.task(name="a", lease=0.1)(_takes_context)
    with pytest.raises(conveyor.ConfigurationError):
        offline_app.task(name="b", queue="")(_takes_context)
    with pytest.raises(conveyor.ConfigurationError):
        offline_app.task(name="c", priority=2**40)(_takes_context)


def test_delay_and_run_at_are_exclusive_and_run_at_is_aware(offline_app: conveyor.App) -> None:
    from datetime import datetime

    @offline_app.task()
    def noop() -> None:
        return None

    with pytest.raises(conveyor.ConfigurationError, match="not both"):
        noop.options(delay=1, run_at=datetime.now().astimezone())
    with pytest.raises(conveyor.ConfigurationError, match="timezone"):
        noop.options(run_at=datetime(2030, 1, 1))
    with pytest.raises(conveyor.ConfigurationError):
        noop.options(delay=-1)


def test_unknown_url_schemes_and_empty_urls_are_configuration_errors() -> None:
    with pytest.raises(conveyor.ConfigurationError, match="scheme"):
        conveyor.App("mysql://x")
    with pytest.raises(conveyor.ConfigurationError, match="empty"):
        conveyor.App("")
    with pytest.raises(conveyor.ConfigurationError, match="file path"):
        conveyor.App("sqlite:///:memory:")
    with pytest.raises(conveyor.ConfigurationError, match="SQLite URL"):
        conveyor.App("sqlite://host/x.db")
    with pytest.raises(conveyor.ConfigurationError, match="unknown SQLite URL option"):
        conveyor.App("sqlite:///x.db?journal=off")
    with pytest.raises(conveyor.ConfigurationError, match="synchronous"):
        conveyor.App("sqlite:///x.db?synchronous=off").make_backend()


def test_without_a_url_the_app_uses_sqlite_in_the_working_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("CONVEYOR_URL", raising=False)
    monkeypatch.chdir(tmp_path)
    app = conveyor.App()

    @app.task
    def noop() -> None:
        return None

    assert app.url == "sqlite:///conveyor.db"
    handle = noop.enqueue()
    assert app.get(handle.id) is not None
    app.close()
    assert (tmp_path / "conveyor.db").exists()


def test_enqueue_chunks_start_small_and_grow_to_the_cap() -> None:
    """The first chunk is what the server waits for: it is small; the next
    ones double up to the cap; together they cover every task once, in order."""
    import itertools

    from conveyor.client import ENQUEUE_CHUNK, ENQUEUE_FIRST_CHUNK, chunk_bounds

    total = ENQUEUE_CHUNK * 3 + 7
    bounds = list(chunk_bounds(total))
    sizes = [end - start for start, end in bounds]
    assert sizes[0] == ENQUEUE_FIRST_CHUNK < ENQUEUE_CHUNK
    assert all(b == min(a * 2, ENQUEUE_CHUNK) for a, b in itertools.pairwise(sizes[:-1]))
    assert max(sizes) == ENQUEUE_CHUNK
    assert [start for start, _ in bounds] == [0] + [end for _, end in bounds[:-1]]
    assert bounds[-1][1] == total
    assert list(chunk_bounds(0)) == []
    assert list(chunk_bounds(3)) == [(0, 3)]


# -- typed payloads (the pydantic extra is installed in the test environment) --


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


@dataclasses.dataclass
class Point:
    x: int
    y: float


class Span(TypedDict):
    start: date
    end: date


class Order(pydantic.BaseModel):
    id: int
    placed: datetime


class Plain(typing.TypedDict):  # pydantic wants typing_extensions.TypedDict on 3.11
    a: int


def _typed_handler(
    when: datetime,
    day: date,
    at: time,
    wait: timedelta,
    ref: UUID,
    amount: Decimal,
    color: Color,
    point: Point,
    span: Span,
    order: Order,
    days: list[date],
    points: dict[str, Point],
    maybe: int | None,
    either: int | str,
) -> None:
    return None


TYPED_ARGS: dict[str, Any] = {
    "when": datetime(2024, 5, 6, 7, 8, 9, tzinfo=UTC),
    "day": date(2024, 5, 6),
    "at": time(7, 8, 9),
    "wait": timedelta(hours=1, seconds=1.5),
    "ref": UUID(int=7),
    "amount": Decimal("9.90"),
    "color": Color.BLUE,
    "point": Point(1, 2.5),
    "span": {"start": date(2024, 1, 1), "end": date(2024, 1, 2)},
    "order": Order(id=3, placed=datetime(2024, 1, 1, tzinfo=UTC)),
    "days": [date(2024, 2, 29)],
    "points": {"a": Point(0, 0.5)},
    "maybe": None,
    "either": "x",
}

TYPED_JSON = {
    "when": "2024-05-06T07:08:09Z",
    "day": "2024-05-06",
    "at": "07:08:09",
    "wait": "PT1H1.5S",
    "ref": "00000000-0000-0000-0000-000000000007",
    "amount": "9.90",
    "color": "blue",
    "point": {"x": 1, "y": 2.5},
    "span": {"start": "2024-01-01", "end": "2024-01-02"},
    "order": {"id": 3, "placed": "2024-01-01T00:00:00Z"},
    "days": ["2024-02-29"],
    "points": {"a": {"x": 0, "y": 0.5}},
    "maybe": None,
    "either": "x",
}


def test_typed_arguments_are_stored_as_json_and_rebuilt_as_declared(
    offline_app: conveyor.App,
) -> None:
    task = offline_app.task(name="typed")(_typed_handler)
    stored = task.encode_args(TYPED_ARGS, 10_000)
    assert json.loads(stored) == TYPED_JSON
    rebuilt = task.build_kwargs(json.loads(stored), None)
    assert rebuilt == TYPED_ARGS
    assert {name: type(value) for name, value in rebuilt.items()} == {
        name: type(value) for name, value in TYPED_ARGS.items()
    }


def test_arguments_may_be_given_in_their_stored_json_form(offline_app: conveyor.App) -> None:
    """How ``conveyor enqueue --args`` gives them: checked in strict JSON mode."""
    task = offline_app.task(name="typed")(_typed_handler)
    assert task.encode_args(TYPED_JSON, 10_000) == task.encode_args(TYPED_ARGS, 10_000)
    mixed = {**TYPED_ARGS, "point": {"x": 1, "y": 2.5}, "when": "2024-05-06T07:08:09Z"}
    assert task.encode_args(mixed, 10_000) == task.encode_args(TYPED_ARGS, 10_000)


@pytest.mark.parametrize(
    ("name", "value", "fragment"),
    [
        ("when", "2024-13-01T00:00:00", "argument 'when' expects datetime, got str"),
        ("when", date(2024, 1, 1), "argument 'when' expects datetime, got date"),
        ("ref", "not-a-uuid", "argument 'ref' expects UUID, got str 'not-a-uuid'"),
        ("color", "green", "argument 'color' expects Color, got str 'green'"),
        ("point", {"x": "1", "y": 2}, "argument 'point' expects Point, got dict"),
        ("point", {"x": 1}, "at y, Field required"),
        ("days", ["2024-02-30"], "argument 'days' expects list[date]"),
        ("maybe", "1", "argument 'maybe' expects int | None, got str '1'"),
        ("either", 1.5, "argument 'either' expects int | str, got float 1.5"),
    ],
)
def test_a_value_that_does_not_fit_its_type_is_refused_before_any_io(
    offline_app: conveyor.App, name: str, value: object, fragment: str
) -> None:
    task = offline_app.task(name="typed")(_typed_handler)
    with pytest.raises(conveyor.PayloadError, match=re.escape(fragment)):
        task.encode_args({**TYPED_ARGS, name: value}, 10_000)


def test_scalars_are_checked_strictly(offline_app: conveyor.App) -> None:
    @offline_app.task()
    def add(a: int, b: str, c: float = 0.0, d: bool = False) -> None:
        return None

    assert add.encode_args({"a": 1, "b": "x", "c": 2, "d": True}, 1000) == (
        '{"a":1,"b":"x","c":2.0,"d":true}'
    )
    refused = [
        ({"a": "5", "b": "x"}, "argument 'a' expects int, got str '5'"),
        ({"a": True, "b": "x"}, "argument 'a' expects int, got bool True"),
        ({"a": 1.0, "b": "x"}, "argument 'a' expects int, got float 1.0"),
        ({"a": 1, "b": 5}, "argument 'b' expects str, got int 5"),
        ({"a": 1, "b": "x", "d": 1}, "argument 'd' expects bool, got int 1"),
        ({"a": 1, "b": "x", "c": "1.5"}, "argument 'c' expects float, got str '1.5'"),
    ]
    for args, fragment in refused:
        with pytest.raises(conveyor.PayloadError, match=re.escape(fragment)):
            add.encode_args(args, 1000)
    with pytest.raises(conveyor.PayloadError, match=r"payload does not fit task 'add'"):
        add.encode_args({"a": "5", "b": "x"}, 1000)


def test_unannotated_and_any_parameters_take_any_json_value(offline_app: conveyor.App) -> None:
    @offline_app.task()
    def loose(a, b: Any, c: object = None, **rest: int) -> None:
        return None

    args = {"a": "5", "b": [1, {"x": None}], "c": 2.5, "extra": "not an int"}
    assert json.loads(loose.encode_args(args, 1000)) == args
    with pytest.raises(conveyor.PayloadError, match="not a JSON type"):
        loose.encode_args({"a": {1, 2}, "b": 1}, 1000)


def test_annotations_that_do_not_resolve_are_not_checked(offline_app: conveyor.App) -> None:
    def handler(ctx: TaskContext, a: Undefined, b: int) -> None:  # noqa: F821
        return None

    task = offline_app.task(name="unresolved")(handler)
    assert task.context_parameter == "ctx"
    assert task.encode_args({"a": "anything", "b": 1}, 1000) == '{"a":"anything","b":1}'
    with pytest.raises(conveyor.PayloadError, match="argument 'b' expects int"):
        task.encode_args({"a": "anything", "b": "1"}, 1000)


def test_the_codec_still_refuses_what_it_refuses_after_conversion(
    offline_app: conveyor.App,
) -> None:
    @offline_app.task()
    def store(ratio: float, name: str, rows: list[dict[str, Any]], when: datetime) -> None:
        return None

    good = {"ratio": 0.5, "name": "a", "rows": [], "when": datetime(2024, 1, 1, tzinfo=UTC)}
    for name, value, fragment in [
        ("ratio", math.nan, "not strict JSON"),
        ("name", "a\x00b", "NUL"),
        ("rows", [{"x": math.inf}], "not strict JSON"),
        ("rows", [{"x": {1, 2}}], "not a JSON type"),
    ]:
        with pytest.raises(conveyor.PayloadError, match=fragment):
            store.encode_args({**good, name: value}, 1000)
    converted = '{"ratio":0.5,"name":"a","rows":[],"when":"2024-01-01T00:00:00Z"}'
    assert store.encode_args(good, len(converted)) == converted
    with pytest.raises(conveyor.PayloadTooLargeError):
        store.encode_args(good, len(converted) - 1)


def test_a_stored_payload_that_no_longer_fits_names_the_argument(
    offline_app: conveyor.App,
) -> None:
    task = offline_app.task(name="typed")(_typed_handler)
    stored = {**TYPED_JSON, "when": "yesterday"}
    with pytest.raises(conveyor.PayloadError) as info:
        task.build_kwargs(stored, None)
    message = str(info.value)
    assert message.startswith("the stored payload does not fit task 'typed': argument 'when'")
    assert "expects datetime, got str 'yesterday'" in message


def test_the_run_time_rebuild_is_lax(offline_app: conveyor.App) -> None:
    """A payload written around enqueue is read as pydantic's lax mode reads it."""

    @offline_app.task()
    def add(a: int, b: float) -> None:
        return None

    assert add.build_kwargs({"a": "5", "b": 1}, None) == {"a": 5, "b": 1.0}
    assert type(add.build_kwargs({"a": 5, "b": 1}, None)["b"]) is float


def test_a_declared_return_type_is_checked_and_rebuilt(offline_app: conveyor.App) -> None:
    @offline_app.task()
    def stamp() -> datetime:
        return datetime(2024, 1, 1, tzinfo=UTC)

    @offline_app.task()
    def untyped():
        return {1, 2}

    assert stamp.encode_result(datetime(2024, 1, 1, tzinfo=UTC), 1000) == '"2024-01-01T00:00:00Z"'
    assert stamp.rebuild_result("2024-01-01T00:00:00Z") == datetime(2024, 1, 1, tzinfo=UTC)
    with pytest.raises(conveyor.PayloadError, match="the result of task 'stamp' expects datetime"):
        stamp.encode_result(3, 1000)
    with pytest.raises(conveyor.PayloadError, match="the stored result of task 'stamp'"):
        stamp.rebuild_result("soon")
    with pytest.raises(conveyor.PayloadError, match="not a JSON type"):
        untyped.encode_result({1, 2}, 1000)
    assert untyped.rebuild_result([1, 2]) == [1, 2]


def test_a_type_pydantic_cannot_validate_is_refused_at_definition(
    offline_app: conveyor.App,
) -> None:
    def locked(lock: threading.Lock) -> None:
        return None

    def plain_typed_dict(value: Plain) -> None:
        return None

    def returns_lock() -> threading.Lock:
        return threading.Lock()

    with pytest.raises(conveyor.ConfigurationError, match="parameter 'lock'"):
        offline_app.task(name="locked")(locked)
    if sys.version_info < (3, 12):
        with pytest.raises(conveyor.ConfigurationError, match=r"typing_extensions\.TypedDict"):
            offline_app.task(name="plain_typed_dict")(plain_typed_dict)
    with pytest.raises(conveyor.ConfigurationError, match="pydantic cannot validate"):
        offline_app.task(name="returns_lock")(returns_lock)


def test_enqueue_takes_positional_arguments_by_the_handler_s_names() -> None:
    app = conveyor.App(f"memory://{uuid.uuid4().hex}")

    @app.task()
    def add(ctx: TaskContext, a: int, b: int = 0) -> int:
        return a + b

    try:
        assert app.get(add.enqueue(1, 2).id).payload == {"a": 1, "b": 2}
        assert app.get(add.enqueue(1, b=3).id).payload == {"a": 1, "b": 3}
        with pytest.raises(conveyor.PayloadError, match="at most 2 positional"):
            add.enqueue(1, 2, 3)
        with pytest.raises(conveyor.PayloadError, match="more than one value for a"):
            add.enqueue(1, a=2)
    finally:
        app.close()


_WITHOUT_PYDANTIC = """
import sys
sys.modules["pydantic"] = None  # as if the extra were not installed
import dataclasses, json
from datetime import datetime
import conveyor, conveyor.typed

assert not conveyor.typed.TYPES_CHECKED

@dataclasses.dataclass
class Point:
    x: int

app = conveyor.App("memory://no-pydantic")

@app.task
def f(a: int, p: Point, when: datetime | None = None) -> datetime:
    return datetime(2024, 1, 1)

print(f.encode_args({"a": "5", "p": Point(1)}, 1000))
print(repr(f.build_kwargs({"a": "5", "p": {"x": 1}}, None)))
try:
    f.encode_args({"p": Point(1)}, 1000)
except conveyor.PayloadError as exc:
    print(exc)
try:
    f.encode_args({"a": 1, "p": Point(1), "when": datetime(2024, 1, 1)}, 1000)
except conveyor.PayloadError as exc:
    print(exc)
"""


def test_without_pydantic_only_names_are_checked() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_PYDANTIC],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert done.stdout.splitlines() == [
        '{"a":"5","p":{"x":1}}',
        "{'a': '5', 'p': Point(x=1)}",
        "payload does not fit task 'f': missing a required argument: a",
        "datetime is not a JSON type",
    ]
