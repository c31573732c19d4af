"""What a worker says while its store is away: once per part and change."""

from __future__ import annotations

import logging

import pytest

from conveyor.errors import BackendError, BackendUnavailableError
from conveyor.worker.outage import Outage, answered
from conveyor.worker.texts import reason


def lines(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    return [(r.levelname, r.getMessage()) for r in caplog.records]


def test_an_outage_is_said_once_per_part_and_its_end_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    outage = Outage()
    down = BackendUnavailableError("connection refused")
    with caplog.at_level(logging.DEBUG, logger="conveyor.worker"):
        outage.ok("claim")  # reachable: nothing to say
        for _ in range(50):
            outage.failed("claim", down)
        outage.failed("heartbeat", down)
        outage.failed("claim", TimeoutError())
        outage.ok("claim")  # the heartbeat still fails: not over
        assert outage.down
        outage.ok("heartbeat")
    said = [(level, text) for level, text in lines(caplog) if level != "DEBUG"]
    assert said[:4] == [
        ("WARNING", "store unreachable (claim): connection refused; retrying with back-off"),
        ("WARNING", "store unreachable (heartbeat): connection refused"),
        ("INFO", "store still unreachable (claim): no answer in time (TimeoutError)"),
        ("INFO", "store reachable again after 0.0s (52 failed calls)"),
    ]
    assert len(said) == 4 and not outage.down and outage.failures == 0
    assert sum(level == "DEBUG" for level, _ in lines(caplog)) == 49


def test_a_new_outage_after_recovery_is_said_again(caplog: pytest.LogCaptureFixture) -> None:
    outage = Outage()
    with caplog.at_level(logging.WARNING, logger="conveyor.worker"):
        outage.failed("completion", BackendUnavailableError("gone"))
        outage.ok("completion")
        outage.failed("completion", BackendUnavailableError("gone"))
    assert [text for _, text in lines(caplog)] == [
        "store unreachable (completion): gone; retrying with back-off"
    ] * 2
    assert outage.logged == 2


def test_a_refusal_of_the_store_is_no_outage_and_is_said_once_per_cause(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A claim the store answered (refused, or with a reply that does not
    read) is not "store unreachable": the store is there."""
    outage = Outage()
    refused = BackendError("Redis refused the operation: value is not a valid float")
    assert answered(refused) and answered(ValueError("invalid literal for int()"))
    assert not answered(BackendUnavailableError("gone")) and not answered(TimeoutError())
    with caplog.at_level(logging.DEBUG, logger="conveyor.worker"):
        for _ in range(5):
            outage.refused("claim", refused)
        outage.refused("claim", ValueError("invalid literal"))
        outage.ok("claim")
        outage.refused("claim", ValueError("invalid literal"))
    said = [(level, text) for level, text in lines(caplog) if level != "DEBUG"]
    assert said == [
        ("ERROR", f"the store refused the claim (it answered): {reason(refused)}"),
        ("ERROR", "the store refused the claim (it answered): invalid literal"),
        ("ERROR", "the store refused the claim (it answered): invalid literal"),
    ]
    assert not outage.down and outage.failures == 0 and outage.logged == 0
