"""What a task receives of its dependencies (conveyor.dependencies): the
stored form reads back as written, a corrupt one is refused with a readable
error, and the values handed over follow each kind."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conveyor import payload as codec
from conveyor.dependencies import (
    RECEIVE_KINDS,
    Receives,
    not_needed,
    parse_receives,
    receives_text,
    with_received,
)
from conveyor.errors import ConfigurationError, PayloadError
from conveyor.model import TaskState
from conveyor.records import DependencyRecord

NAMES = st.from_regex(r"[a-z_][a-z0-9_]{0,20}", fullmatch=True)


@given(kind=st.sampled_from(RECEIVE_KINDS), parameter=NAMES, only_failed=st.booleans())
def test_the_stored_form_reads_back(kind: str, parameter: str, only_failed: bool) -> None:
    text = receives_text(kind, parameter, only_failed)
    assert text is not None
    assert parse_receives(text) == Receives(kind, parameter, only_failed)  # type: ignore[arg-type]


def test_nothing_to_receive_stores_nothing() -> None:
    assert receives_text(None, None) is None
    assert parse_receives(receives_text(None, None, True) or "") == Receives(None, None, True)


@pytest.mark.parametrize(
    "text", ["", "result", "result:", "nope:x", "result:1x", "result:a;result:b", "only=x"]
)
def test_a_corrupt_stored_form_is_refused(text: str) -> None:
    with pytest.raises(PayloadError, match="does not read"):
        parse_receives(text)


def test_bad_kinds_and_parameters_are_refused() -> None:
    with pytest.raises(ConfigurationError, match="receives one of"):
        receives_text("everything", "x")
    with pytest.raises(ConfigurationError, match="not a parameter name"):
        receives_text("result", "not a name")


def record(task_id: int, state: TaskState | None, result: object = None) -> DependencyRecord:
    return DependencyRecord(task_id, "job", state, result, None, None, True)


def test_each_kind_hands_over_its_value() -> None:
    records = [record(1, TaskState.SUCCEEDED, 10), record(2, TaskState.FAILED), record(3, None)]
    payload = codec.encode({"x": 1})
    got = {
        kind: codec.decode(with_received(payload, Receives(kind, "got"), records))["got"]
        for kind in RECEIVE_KINDS
    }
    assert got["result"] == 10
    assert got["results"] == [10, None, None]
    assert [o["state"] for o in got["outcomes"]] == ["succeeded", "failed", None]
    assert codec.decode(with_received(payload, Receives(None, None), records)) == {"x": 1}
    with pytest.raises(PayloadError, match="not a JSON object"):
        with_received("[1]", Receives("result", "got"), records)


def test_a_task_meant_for_a_failure_is_not_needed_when_all_succeeded() -> None:
    only = Receives(None, None, only_failed=True)
    assert not_needed(only, [record(1, TaskState.SUCCEEDED)])
    assert not not_needed(only, [record(1, TaskState.SUCCEEDED), record(2, TaskState.CANCELLED)])
    assert not not_needed(Receives(None, None), [record(1, TaskState.SUCCEEDED)])
