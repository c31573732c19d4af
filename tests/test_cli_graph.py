"""``conveyor graph``, run for real in subprocesses: the graph of
dependencies around a task by layer and counted by state (text and
``--json``), truncation at ``--limit``, ``--cancel`` of the tasks not
ended and ``--retry-failed`` of the failed ones, unknown ids."""

from __future__ import annotations

import pytest

from tests.cli_harness import Cli
from tests.conftest import CLI_ON_REDIS

APP = "tests.apps.cli_app:app"


def _diamond(cli: Cli) -> tuple[int, int, int, int]:
    """Two roots, a task after both, one after that."""
    a = cli.enqueue("add", {"a": 1, "b": 1})
    b = cli.enqueue("[bold]add", {})
    c = cli.enqueue("add", {}, "--after", f"{a},{b}")
    d = cli.enqueue("add", {}, "--after", str(c))
    return a, b, c, d


@CLI_ON_REDIS
def test_graph_prints_layers_and_counts_and_json(cli: Cli) -> None:
    a, b, c, d = _diamond(cli)
    text = cli.ok("graph", str(c))
    assert f"task {c}: 4 task(s) in its graph, 3 edge(s)" in text
    assert "states: pending 2, waiting 2" in text
    lines = [x.strip() for x in text.splitlines()]
    at = lines.index("layer 0:")
    assert lines[at : at + 7] == [
        "layer 0:",
        f"{a} pending add",
        f"{b} pending [bold]add",  # stored text, printed as it is
        "layer 1:",
        f"{c} waiting add",
        "layer 2:",
        f"{d} waiting add",
    ]
    assert "truncated" not in text

    data = cli.json("graph", str(a))
    assert data["task_id"] == a and data["roots"] == [a, b] and not data["truncated"]
    assert data["counts"] == {"pending": 2, "waiting": 2}
    assert [(n["id"], n["state"], n["layer"]) for n in data["nodes"]] == [
        (a, "pending", 0),
        (b, "pending", 0),
        (c, "waiting", 1),
        (d, "waiting", 2),
    ]
    assert data["edges"] == [
        {"dependent": c, "position": 0, "dependency": a, "settled": False},
        {"dependent": c, "position": 1, "dependency": b, "settled": False},
        {"dependent": d, "position": 0, "dependency": c, "settled": False},
    ]

    cut = cli.json("graph", str(d), "--limit", "2")
    assert cut["truncated"] and [n["id"] for n in cut["nodes"]] == [c, d]
    assert "truncated at 2 task(s)" in cli.ok("graph", str(d), "--limit", "2")


def test_graph_cancel_takes_every_task_not_ended(cli: Cli) -> None:
    a, b, _, d = _diamond(cli)
    alone = cli.enqueue("add", {})
    last = cli.ok("graph", str(d), "--cancel").splitlines()[-1]
    # a's cancel ends c and d by their policy: an engine counts them as the
    # bulk cancel's own, or not (they were no longer waiting when it came to them)
    assert last in ("cancelled 2 task(s)", "cancelled 4 task(s)")
    data = cli.json("graph", str(b))
    assert data["counts"] == {"cancelled": 4}
    assert cli.show(alone)["state"] == "pending"
    again = cli.json("graph", str(a), "--cancel")
    assert again["cancelled"] == []
    assert "not both" in cli.fails("graph", str(a), "--cancel", "--retry-failed")
    assert "999999" in cli.fails("graph", "999999")
    assert "999999" in cli.fails("graph", "999999", "--json")


def test_graph_retry_failed_takes_the_failed_tasks(cli: Cli) -> None:
    good = cli.enqueue("add", {"a": 2, "b": 3})
    bad = cli.enqueue("explode", {"message": "boom"}, "--max-attempts", "1")
    after = cli.enqueue(
        "add", {"a": 1, "b": 1}, "--after", f"{good},{bad}", "--on-dependency-failure", "fail"
    )
    cli.ok("worker", APP, "--burst", "--poll-interval", "0.1", timeout=30)
    before = cli.json("graph", str(good))
    assert before["counts"] == {"succeeded": 1, "failed": 2}
    data = cli.json("graph", str(good), "--retry-failed")
    assert data["retried"] == [bad, after]
    assert data["counts"] == {"succeeded": 1, "failed": 2}  # as read before the retry
    assert cli.json("graph", str(after))["counts"] == {"pending": 2, "succeeded": 1}
    assert cli.ok("graph", str(good), "--retry-failed").splitlines()[-1] == "retried 0 task(s)"


@pytest.mark.parametrize("limit", ["0", "x"])
def test_graph_refuses_a_bad_limit(cli: Cli, limit: str) -> None:
    assert "--limit" in cli.usage_error("graph", "1", "--limit", limit)
