"""The garbage collector of a worker process (conveyor.worker.collector):
set by ``conveyor worker``, left alone with ``--gc-threshold 0``."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from conveyor.worker.collector import DEFAULT_THRESHOLD, tune_collector
from tests.cli_harness import Cli

APP = "tests.apps.collector_app:app"
FROZEN_APP = 5_000
"""More objects than any interpreter freezes of its own (none on 3.11, a few
hundred at start on 3.12), fewer than a worker's app, modules and
connections (some 50,000)."""


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
    frozen = gc.get_freeze_count()
    alive = [object()]  # a container: tracked by the collector
    assert any(o is alive for o in gc.get_objects())
    tune_collector(5000)
    assert gc.get_threshold() == (5000, middle, oldest)
    assert gc.get_freeze_count() > frozen
    # Frozen: in no generation that a collection traverses.
    assert not any(o is alive for o in gc.get_objects())


@pytest.mark.usefixtures("restored_collector")
@pytest.mark.parametrize("threshold", [0, -1])
def test_tune_collector_never_switches_collection_off(threshold: int) -> None:
    before, frozen = gc.get_threshold(), gc.get_freeze_count()
    with pytest.raises(ValueError, match="must be positive"):
        tune_collector(threshold)
    assert (gc.get_threshold(), gc.get_freeze_count()) == (before, frozen)


@pytest.mark.parametrize(
    ("options", "threshold", "frozen"),
    [
        ((), DEFAULT_THRESHOLD, True),
        (("--gc-threshold", "25000"), 25000, True),
        (("--gc-threshold", "0"), gc.get_threshold()[0], False),
    ],
)
def test_the_worker_command_sets_its_process_collector(
    cli: Cli, options: tuple[str, ...], threshold: int, frozen: bool
) -> None:
    task_id = cli.enqueue("collector")
    cli.ok("worker", APP, "--burst", "--poll-interval", "0.1", *options, timeout=60)
    result = cli.show(task_id)["result"]
    assert result["threshold"] == threshold
    assert (result["frozen"] > FROZEN_APP) is frozen, result
