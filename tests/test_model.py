"""The pure core: retry policy arithmetic and validation."""

from __future__ import annotations

import random

import pytest

from conveyor import ConfigurationError, RetryPolicy, TaskState


def test_backoff_grows_and_caps() -> None:
    policy = RetryPolicy(
        max_attempts=10, initial_interval=1, max_interval=10, backoff_coefficient=2, jitter=0
    )
    assert [policy.delay(n) for n in range(1, 7)] == [1, 2, 4, 8, 10, 10]


def test_jitter_stays_within_its_fraction() -> None:
    policy = RetryPolicy(initial_interval=10, max_interval=100, jitter=0.1)
    rng = random.Random(7)
    delays = [policy.delay(1, rng) for _ in range(200)]
    assert all(9 <= d <= 11 for d in delays)
    assert len(set(delays)) > 100


def test_huge_attempt_counts_do_not_overflow() -> None:
    policy = RetryPolicy(max_attempts=10_000, jitter=0)
    assert policy.delay(5_000) == policy.max_interval


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_attempts": 0},
        {"initial_interval": -1},
        {"max_interval": float("nan")},
        {"backoff_coefficient": 0.5},
        {"jitter": 2},
    ],
)
def test_invalid_policies_are_rejected(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigurationError):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


def test_policy_round_trips_through_json() -> None:
    policy = RetryPolicy(
        max_attempts=3, initial_interval=0.5, max_interval=9, backoff_coefficient=3, jitter=0.2
    )
    assert RetryPolicy.from_json(policy.to_json()) == policy


def test_terminal_states() -> None:
    assert {s for s in TaskState if s.is_terminal} == {
        TaskState.SUCCEEDED,
        TaskState.FAILED,
        TaskState.CANCELLED,
    }
