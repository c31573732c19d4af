"""The batched reads by ids, on every backend: ``Backend.edges`` gives each
edge whose dependent or dependency is among the ids (a chord's, a chain's),
once, by dependent then position, with its settled mark; unknown ids give
nothing, a deleted dependency's edges are found from their dependents'
side only; ``Inspector.summaries`` gives the stored tasks among the ids.
Both refuse more than MAX_READ_IDS ids, or what is not a task id."""

from __future__ import annotations

import pytest

from conveyor.backends.capabilities import Inspector, capability_of
from conveyor.backends.params import MAX_READ_IDS, earlier
from conveyor.backends.protocol import Backend, Capability
from conveyor.errors import ConfigurationError
from conveyor.model import MAX_TASK_ID, TaskState
from conveyor.records import CancelMany, DependencyEdge, TaskFilter
from tests.conformance.test_dependencies import after, run
from tests.conformance.test_tasks import enqueue, later, new

E = DependencyEdge


def _inspector(backend: Backend) -> Inspector:
    found = capability_of(backend, Capability.INSPECT)
    assert found is not None
    return found


async def test_a_chords_edges_from_a_member_and_from_its_callback(backend: Backend) -> None:
    [a, b, c, callback] = await enqueue(
        backend, new(), new(), new(), after(earlier(0), earlier(1), earlier(2))
    )
    assert await backend.edges([b]) == [E(callback, 1, b, False)]
    whole = [E(callback, 0, a, False), E(callback, 1, b, False), E(callback, 2, c, False)]
    assert await backend.edges([callback]) == whole
    # each edge once, though both of its ends are asked about
    assert await backend.edges([c, callback, a, callback]) == whole


async def test_a_chains_edges_are_read_from_both_ends(backend: Backend) -> None:
    [one, two, three] = await enqueue(backend, new(), after(earlier(0)), after(earlier(1)))
    [four] = await enqueue(backend, after(three))
    assert await backend.edges([two]) == [E(two, 0, one, False), E(three, 0, two, False)]
    assert await backend.edges([one, four]) == [E(two, 0, one, False), E(four, 0, three, False)]


async def test_a_task_without_dependencies_and_unknown_ids_have_no_edges(
    backend: Backend,
) -> None:
    [alone] = await enqueue(backend, new())
    [a] = await enqueue(backend, new())
    await enqueue(backend, after(a))
    assert await backend.edges([alone]) == []
    assert await backend.edges([]) == []
    assert await backend.edges([alone + 1000, 0, -3, MAX_TASK_ID, MAX_TASK_ID + 1]) == []


async def test_an_edge_is_read_settled_once_its_dependency_ended(backend: Backend) -> None:
    [a, b] = await enqueue(backend, new(), new())
    [d] = await enqueue(backend, after(a, b))
    await run(backend, (a, "ok"))
    assert await backend.edges([d]) == [E(d, 0, a, True), E(d, 1, b, False)]
    await run(backend, (b, "fail"), at=2)  # which ends d by its policy
    assert await backend.edges([a, b]) == [E(d, 0, a, True), E(d, 1, b, True)]
    # the retry of a settled dependency leaves its edge settled
    await backend.retry(b, now=later(3))
    assert await backend.edges([b]) == [E(d, 1, b, True)]


async def test_a_deleted_dependencys_edges_are_found_from_their_dependents(
    backend: Backend,
) -> None:
    [a] = await enqueue(backend, new())
    [d] = await enqueue(backend, after(a))
    await backend.cancel_many(CancelMany(ids=[a], states=(TaskState.PENDING,), now=later(1)))
    await backend.delete(a)
    assert await backend.edges([d]) == [E(d, 0, a, True)]
    assert await backend.edges([a]) == []
    await backend.delete(d)
    assert await backend.edges([d, a]) == []


async def test_the_reads_by_ids_refuse_too_many_ids_and_what_is_no_id(backend: Backend) -> None:
    inspector = _inspector(backend)
    too_many = list(range(1, MAX_READ_IDS + 2))
    for read in (backend.edges, inspector.summaries):
        with pytest.raises(ConfigurationError, match="chunks"):
            await read(too_many)
        with pytest.raises(ConfigurationError):
            await read(["1"])  # type: ignore[list-item]
        with pytest.raises(ConfigurationError):
            await read([True])
    assert await backend.edges(list(range(1, MAX_READ_IDS + 1))) == []


async def test_summaries_give_the_stored_tasks_among_ids(backend: Backend) -> None:
    inspector = _inspector(backend)
    [a, b] = await enqueue(backend, new("first"), new("second"))
    [d] = await enqueue(backend, after(a, b))
    await backend.cancel(b, now=later(1))
    found = await inspector.summaries([a, d + 1000, b, d, a, 0])
    assert [(s.id, s.name, s.state) for s in found] == [
        (d, "job", TaskState.CANCELLED),
        (b, "second", TaskState.CANCELLED),
        (a, "first", TaskState.PENDING),
    ]
    # the same summaries a listing gives
    assert found == await inspector.list_summaries(TaskFilter(limit=3))
    assert await inspector.summaries([]) == []
