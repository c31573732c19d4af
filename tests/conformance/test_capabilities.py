"""What each backend offers beyond the common contract, asserted, not skipped."""

from __future__ import annotations

import pytest

import conveyor
from conveyor.backends import Backend
from conveyor.backends.capabilities import (
    AttemptTransactions,
    HandOffs,
    Inspector,
    TransactionalEnqueue,
    Turns,
    Vacuums,
    capability_of,
)
from conveyor.backends.protocol import Capability

EXPECTED = {
    "PostgresBackend": {
        Capability.TRANSACTIONAL_ENQUEUE,
        Capability.ATTEMPT_TRANSACTION,
        Capability.NOTIFICATIONS,
        Capability.INSPECT,
        Capability.VACUUM,
        Capability.TURNS,
        Capability.HANDOFF,
    },
    "SQLiteBackend": {
        Capability.TRANSACTIONAL_ENQUEUE,
        Capability.NOTIFICATIONS,
        Capability.INSPECT,
    },
    "MemoryBackend": {Capability.NOTIFICATIONS, Capability.INSPECT},
    "RedisBackend": {Capability.NOTIFICATIONS, Capability.INSPECT},
}
PROTOCOLS = {
    Capability.TRANSACTIONAL_ENQUEUE: TransactionalEnqueue,
    Capability.ATTEMPT_TRANSACTION: AttemptTransactions,
    Capability.INSPECT: Inspector,
    Capability.VACUUM: Vacuums,
    Capability.TURNS: Turns,
    Capability.HANDOFF: HandOffs,
}


def test_each_backend_declares_what_it_offers(backend: Backend) -> None:
    assert backend.capabilities == EXPECTED[type(backend).__name__]


def test_a_backend_implements_exactly_the_optional_protocols_it_declares(
    backend: Backend,
) -> None:
    """No method that only raises: a backend without a capability has none
    of its methods, and one with it has them all."""
    assert isinstance(backend, Backend)
    for capability, protocol in PROTOCOLS.items():
        assert isinstance(backend, protocol) == (capability in backend.capabilities), capability
    assert (capability_of(backend, Capability.TRANSACTIONAL_ENQUEUE) is not None) == isinstance(
        backend, TransactionalEnqueue
    )
    assert (capability_of(backend, Capability.ATTEMPT_TRANSACTION) is not None) == isinstance(
        backend, AttemptTransactions
    )
    assert (capability_of(backend, Capability.INSPECT) is not None) == isinstance(
        backend, Inspector
    )
    assert (capability_of(backend, Capability.TURNS) is not None) == isinstance(backend, Turns)
    assert (capability_of(backend, Capability.HANDOFF) is not None) == isinstance(backend, HandOffs)
    assert (capability_of(backend, Capability.VACUUM) is not None) == isinstance(backend, Vacuums)


def test_a_capability_declared_without_its_methods_is_refused(backend: Backend) -> None:
    """The lookup trusts no declaration: a backend that claims a capability
    whose protocol it does not implement is a TypeError, never a half-built
    capability handed on."""
    backend.capabilities = backend.capabilities | set(PROTOCOLS)
    for capability, protocol in PROTOCOLS.items():
        if isinstance(backend, protocol):
            assert capability_of(backend, capability) is backend
        else:
            with pytest.raises(TypeError, match=f"declares {capability.value} without"):
                capability_of(backend, capability)


async def test_attempt_transactions_open_and_roll_back(backend: Backend) -> None:
    transactions = capability_of(backend, Capability.ATTEMPT_TRANSACTION)
    if transactions is None:
        assert not hasattr(backend, "begin_attempt_transaction")
        return
    transaction = await transactions.begin_attempt_transaction("w")
    await transaction.rollback()


def test_a_client_without_transactional_enqueue_refuses_a_connection_clearly() -> None:
    """The client, not each backend, says so: once, before any I/O."""
    with conveyor.App("memory://no-transactions") as app:

        @app.task()
        def job() -> None:
            return None

        with pytest.raises(conveyor.ConfigurationError, match="transaction"):
            app.enqueue(job, connection=object())
        with pytest.raises(conveyor.ConfigurationError, match="transaction"):
            job.options(connection=object()).enqueue()
        with pytest.raises(conveyor.ConfigurationError, match="transaction"):
            app.send(1, {"n": 1}, connection=object())
        assert app.list_tasks() == []
