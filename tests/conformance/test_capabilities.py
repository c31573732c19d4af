"""What each backend offers beyond the common contract, asserted, not skipped."""

from __future__ import annotations

import pytest

from conveyor.backends import Backend
from conveyor.backends.protocol import Capability, EnqueueParams, NewTask
from conveyor.errors import ConfigurationError
from conveyor.model import RetryPolicy

EXPECTED = {
    "PostgresBackend": {
        Capability.TRANSACTIONAL_ENQUEUE,
        Capability.ATTEMPT_TRANSACTION,
        Capability.NOTIFICATIONS,
    },
    "SQLiteBackend": {Capability.TRANSACTIONAL_ENQUEUE, Capability.NOTIFICATIONS},
    "MemoryBackend": {Capability.NOTIFICATIONS},
}


def test_each_backend_declares_what_it_offers(backend: Backend) -> None:
    assert backend.capabilities == EXPECTED[type(backend).__name__]


async def test_backends_without_transactions_refuse_them_clearly(backend: Backend) -> None:
    if Capability.TRANSACTIONAL_ENQUEUE in backend.capabilities:
        return  # exercised against real connections in tests/worker/test_worker.py
    task = NewTask(
        name="job",
        queue="default",
        payload="{}",
        priority=0,
        max_attempts=1,
        retry=RetryPolicy(max_attempts=1),
    )
    with pytest.raises(ConfigurationError, match="transaction"):
        await backend.enqueue(EnqueueParams([task]), connection=object())
    with pytest.raises(ConfigurationError, match="transaction"):
        backend.enqueue_sync(EnqueueParams([task]), connection=object())
    with pytest.raises(ConfigurationError, match="transaction"):
        await backend.begin_attempt_transaction("w")


async def test_backends_without_attempt_transactions_refuse_them_clearly(
    backend: Backend,
) -> None:
    if Capability.ATTEMPT_TRANSACTION in backend.capabilities:
        transaction = await backend.begin_attempt_transaction("w")
        await transaction.rollback()
        return
    with pytest.raises(ConfigurationError, match="transaction"):
        await backend.begin_attempt_transaction("w")
    with pytest.raises(ConfigurationError, match="transaction"):
        backend.begin_attempt_transaction_sync("w")
