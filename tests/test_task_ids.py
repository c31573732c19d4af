"""Task ids read from text: one rule (:func:`conveyor.model.parse_task_id`),
used by the dashboard and the command line."""

from __future__ import annotations

import pytest

from conveyor.errors import ConfigurationError
from conveyor.model import parse_task_id
from tests.cli_harness import Cli


@pytest.mark.parametrize("text", ["0", "7", "123456789012345678", "007"])
def test_ascii_digits_are_a_task_id(text: str) -> None:
    assert parse_task_id(text) == int(text)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "\u00b2",  # a superscript two: str.isdigit says yes, int() refuses
        "\u0663",  # an Arabic-Indic three: int() would take it
        "\uff11",  # a full-width one
        " 12",
        "12 ",
        "+12",
        "-1",
        "1_000",
        "1e3",
        "1234567890123456789",
        "12\x00",
        None,
        12,
    ],
)
def test_anything_else_is_refused(text: object) -> None:
    with pytest.raises(ConfigurationError, match="the id must be a task id"):
        parse_task_id(text, "the id")


def test_the_command_line_takes_ascii_digits_only(cli: Cli) -> None:
    task_id = cli.enqueue("add", {"a": 1})
    assert cli.show(task_id)["id"] == task_id
    for bad in ("\u0663", "\u00b2", "+1", "1_0"):
        assert "must be a task id" in cli.usage_error("show", bad)
        assert "must be a task id" in cli.usage_error("cancel", bad)
    assert "must be a task id" in cli.usage_error("tasks", "--before", "\u0663")
