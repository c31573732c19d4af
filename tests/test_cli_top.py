"""``conveyor top``: one frame printed with ``--once`` against a real store
(queues with due, later, running and waiting tasks, a live worker), and
the rates computed between two frames."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta

from rich.console import Console

from conveyor.cli.top import Frame, render
from conveyor.model import TaskState
from conveyor.records import QueueBacklog, WorkerInfo
from tests.cli_harness import Cli
from tests.conftest import CLI_ON_REDIS

APP = "tests.apps.cli_app:app"


@CLI_ON_REDIS
def test_one_frame_shows_each_queue_and_the_live_workers(cli: Cli) -> None:
    for n in range(3):
        cli.enqueue("add", {"a": n, "b": 1})
    cli.enqueue("add", {"a": 9, "b": 9}, "--delay", "600")
    cli.enqueue("add", {"a": 1, "b": 1}, "--queue", "mail")
    cli.ok("worker", APP, "--burst", "--queues", "mail")  # drains mail, and stays registered
    out = cli.ok("top", "--once")
    rows = table_rows(out)
    assert rows["default"][:4] == ["3", "1", "0", "0"]  # due, later, running, waiting
    assert rows["default"][4] != "-"  # its oldest due task has waited a moment
    assert rows["mail"][:5] == ["0", "0", "0", "0", "-"]  # drained
    assert "conveyor top" in out
    assert "no live worker" in out  # the burst worker stopped


def table_rows(text: str) -> dict[str, list[str]]:
    """Each table row of a rich frame, by its first cell."""
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if cells:
            rows[cells[0]] = cells[1:]
    return rows


def frame(at: datetime, taken: float, done: int, failed: int) -> Frame:
    states = Counter({("q", TaskState.SUCCEEDED): done, ("q", TaskState.FAILED): failed})
    worker = WorkerInfo("w1", "host", 7, ("q",), 4, last_seen_at=at)
    return Frame(
        at, taken, {"q": QueueBacklog("q", 5, 2, at - timedelta(seconds=90))}, states, [worker]
    )


def test_rates_come_from_two_frames_and_never_go_negative() -> None:
    at = datetime(2030, 1, 1, tzinfo=UTC)
    console = Console(width=200, record=True)
    console.print(render(frame(at, 10.0, 100, 5), frame(at, 8.0, 40, 1), "memory://x"))
    text = console.export_text()
    assert table_rows(text)["q"] == ["5", "2", "0", "0", "1 m 30 s", "30.0", "2.0"]
    assert "w1" in text and "host:7" in text
    # A prune between frames lowers the counts: no progress, not a negative rate.
    console = Console(width=200, record=True)
    console.print(render(frame(at, 10.0, 10, 0), frame(at, 8.0, 40, 1), "memory://x"))
    assert table_rows(console.export_text())["q"][5:] == ["0.0", "0.0"]
