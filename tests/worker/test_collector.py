"""The garbage collector of a worker process (conveyor.worker.collector):
set by ``conveyor worker``, left alone with ``--gc-threshold 0``."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from conveyor.worker.collector import DEFAULT_THRESHOLD, tune_collector
from tests.cli_harness import Cli

APP = "tests.apps.collector_app:app"


@pytest.fixture
def restored_collector() -> Iterator[None]:
    """The test process's collector as it was, after the test."""
    before = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*before)


@pytest.mark.usefixtures("restored_collector")
def test_tune_collector_freezes_what_lives_and_raises_the_youngest_threshold() -> None:
    _, middle, oldest = gc.get_threshold()
    alive = [object()]  # a container: tracked by the collector
    assert any(o is alive for o in gc.get_objects())
    tune_collector(5000)
    assert gc.get_threshold() == (5000, middle, oldest)
    assert gc.get_freeze_count() > 0
    # Frozen: in no generation that a collection traverses.
    assert not any(o is alive for o in gc.get_objects())


@pytest.mark.usefixtures("restored_collector")
@pytest.mark.parametrize("threshold", [0, -1])
def test_tune_collector_never_switches_collection_off(threshold: int) -> None:
    before = gc.get_threshold()
    with pytest.raises(ValueError, match="must be positive"):
        tune_collector(threshold)
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ((), {"threshold": DEFAULT_THRESHOLD, "frozen": True}),
        (("--gc-threshold", "25000"), {"threshold": 25000, "frozen": True}),
        (("--gc-threshold", "0"), {"threshold": gc.get_threshold()[0], "frozen": False}),
    ],
)
def test_the_worker_command_sets_its_process_collector(
    cli: Cli, options: tuple[str, ...], expected: dict[str, object]
) -> None:
    task_id = cli.enqueue("collector")
    cli.ok("worker", APP, "--burst", "--poll-interval", "0.1", *options, timeout=60)
    assert cli.show(task_id)["result"] == expected
