"""The strict JSON codec: what it accepts round-trips, what it rejects is typed;
and values typed by a handler's hints, converted before it and rebuilt after it."""

from __future__ import annotations

import dataclasses
import enum
import math
import threading
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any
from uuid import UUID

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conveyor import hints, typed
from conveyor import payload as codec
from conveyor.errors import PayloadError, PayloadTooLargeError

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text().filter(
        lambda s: "\x00" not in s and not any(0xD800 <= ord(c) <= 0xDFFF for c in s)
    ),
    lambda children: (
        st.lists(children, max_size=5)
        | st.dictionaries(
            st.text(max_size=10).filter(
                lambda s: "\x00" not in s and not any(0xD800 <= ord(c) <= 0xDFFF for c in s)
            ),
            children,
            max_size=5,
        )
    ),
    max_leaves=30,
)


@given(json_values)
def test_accepted_values_round_trip(value: object) -> None:
    assert codec.decode(codec.encode(value)) == value


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ({"x": math.nan}, "not strict JSON"),
        ({"x": math.inf}, "not strict JSON"),
        ({"x": -math.inf}, "not strict JSON"),
        ({"x": "a\x00b"}, "NUL"),
        ({"x": "\ud800"}, "surrogate"),
        ({1: "a"}, "keys must be strings"),
        ({"x": {1, 2}}, "not a JSON type"),
        ({"x": b"bytes"}, "not a JSON type"),
    ],
)
def test_rejects_what_is_not_strict_json(value: object, fragment: str) -> None:
    with pytest.raises(PayloadError, match=fragment):
        codec.encode(value)


def test_rejects_deep_nesting() -> None:
    value: object = 1
    for _ in range(codec.MAX_DEPTH + 2):
        value = [value]
    with pytest.raises(PayloadError, match="nesting"):
        codec.encode(value)


def test_size_cap_is_exact() -> None:
    text = codec.encode({"s": ""})
    room = 100 - len(text)
    at_cap = {"s": "x" * room}
    assert len(codec.encode(at_cap, 100).encode()) == 100
    with pytest.raises(PayloadTooLargeError) as info:
        codec.encode({"s": "x" * (room + 1)}, 100)
    assert info.value.size == 101
    assert info.value.limit == 100


def test_size_counts_utf8_bytes() -> None:
    with pytest.raises(PayloadTooLargeError):
        codec.encode({"s": "é" * 60}, 100)  # 120 bytes of UTF-8, 60 characters


def test_dataclasses_become_objects() -> None:
    @dataclasses.dataclass
    class Point:
        x: int
        y: int

    assert codec.decode(codec.encode({"p": Point(1, 2)})) == {"p": {"x": 1, "y": 2}}
    assert codec.decode(codec.encode(Point(3, 4))) == {"x": 3, "y": 4}


def test_corrupt_stored_json_is_a_payload_error() -> None:
    with pytest.raises(PayloadError):
        codec.decode("{not json")
    with pytest.raises(PayloadError):
        codec.decode('{"x": NaN}')


def test_json_nested_too_deep_for_the_decoder_is_a_payload_error() -> None:
    with pytest.raises(PayloadError, match="does not decode"):
        codec.decode("[" * 100_000 + "]" * 100_000)


def test_a_value_that_fails_to_convert_is_a_payload_error() -> None:
    @dataclasses.dataclass
    class Locked:
        lock: object

    class Model:
        def model_dump(self, mode: str) -> object:
            raise RuntimeError("broken model")

    with pytest.raises(PayloadError, match="Locked does not convert to JSON: cannot pickle"):
        codec.encode({"x": Locked(threading.Lock())})
    with pytest.raises(PayloadError, match="Model does not convert to JSON: broken model"):
        codec.encode(Model())


def test_a_payload_that_does_not_decode_is_shown_as_its_stored_text() -> None:
    assert codec.decode_for_display("{not json") == "{not json"
    assert codec.decode_for_display(b"\xff{") == "\\xff{"
    assert codec.decode_for_display('{"a": 1}') == {"a": 1}


# -- typed values: converted before the codec, rebuilt after it ---------------


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


@dataclasses.dataclass
class Reading:
    at: datetime
    level: Level
    value: Decimal


typed_values = st.one_of(
    st.tuples(st.just(datetime), st.datetimes(timezones=st.just(UTC))),
    st.tuples(st.just(date), st.dates()),
    st.tuples(st.just(time), st.times()),
    st.tuples(st.just(timedelta), st.timedeltas()),
    st.tuples(st.just(UUID), st.uuids()),
    st.tuples(st.just(Decimal), st.decimals(allow_nan=False, allow_infinity=False)),
    st.tuples(st.just(Level), st.sampled_from(Level)),
    st.tuples(st.just(list[date]), st.lists(st.dates(), max_size=3)),
    st.tuples(
        st.just(Reading),
        st.builds(
            Reading,
            st.datetimes(timezones=st.just(UTC)),
            st.sampled_from(Level),
            st.decimals(allow_nan=False, allow_infinity=False, places=2),
        ),
    ),
)


@given(typed_values)
def test_typed_values_round_trip_through_the_codec(case: tuple[object, object]) -> None:
    annotation, value = case
    kind = typed.ValueType(annotation, "test")
    stored = codec.encode(kind.to_json(value))
    rebuilt = kind.from_json(codec.decode(stored))
    assert rebuilt == value
    assert type(rebuilt) is type(value)


def test_conversion_keeps_the_codec_s_refusals() -> None:
    floats = typed.ValueType(list[float], "test")
    with pytest.raises(PayloadError, match="not strict JSON"):
        codec.encode(floats.to_json([1.0, math.nan]))
    texts = typed.ValueType(dict[str, str], "test")
    with pytest.raises(PayloadError, match="NUL"):
        codec.encode(texts.to_json({"k": "a\x00"}))
    nested = typed.ValueType(list[Any], "test")
    deep: object = 1
    for _ in range(codec.MAX_DEPTH + 2):
        deep = [deep]
    with pytest.raises(PayloadError, match="nesting"):
        codec.encode(nested.to_json([deep]))


def test_type_names_are_short() -> None:
    assert hints.type_name(int) == "int"
    assert hints.type_name(datetime) == "datetime"
    assert hints.type_name(list[Reading]) == "list[Reading]"
    assert hints.type_name(int | None) == "int | None"
    assert hints.type_name(dict[str, Any]) == "dict[str, Any]"


def test_annotations_resolve_one_by_one() -> None:
    def handler(a: int, b: Missing, c: Reading) -> Level:  # noqa: F821
        raise NotImplementedError

    assert hints.declared_types(handler) == {"a": int, "c": Reading, "return": Level}
