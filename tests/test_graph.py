"""The graph of dependencies around a task (conveyor.graph), through the
client, on every backend: a chord's component from a member and from its
callback, a chain's, layers by longest path, a task without edges, a group
without a callback (no edge: each member alone), truncation at the limit,
a task not stored; and the walk's chunked reads."""

from __future__ import annotations

from typing import Any

import pytest

import conveyor
from conveyor import TaskState, chain, chord, group
from conveyor.errors import ConfigurationError, TaskNotFoundError
from conveyor.graph import TaskGraph


@pytest.fixture
def app(any_app: conveyor.App) -> conveyor.App:
    return any_app


def _tasks(app: conveyor.App) -> dict[str, Any]:
    @app.task()
    async def member(n: int) -> int:
        return n

    @app.task()
    async def total() -> int:
        return 0

    return {"member": member, "total": total}


def _shape(graph: TaskGraph) -> list[list[int]]:
    return [[node.id for node in layer] for layer in graph.layers]


async def test_a_chords_graph_from_a_member_and_from_its_callback(app: conveyor.App) -> None:
    t = _tasks(app)
    async with app:
        handle = await chord([t["member"].s(n=n) for n in range(3)], t["total"].s()).enqueue_async()
        members, callback = handle.group.ids, handle.callback.id
        await app.cancel_async(members[1])  # the callback (policy run) waits on
        for start in (members[0], callback):
            graph = await app.graph_async(start)
            assert graph.task_id == start and not graph.truncated
            assert _shape(graph) == [members, [callback]]
            assert graph.roots == members
            assert [(e.dependent, e.position, e.dependency) for e in graph.edges] == [
                (callback, i, m) for i, m in enumerate(members)
            ]
            assert [e.settled for e in graph.edges] == [False, True, False]
            assert {n.id: (n.name, n.state) for n in graph.nodes} == {
                members[0]: ("member", TaskState.PENDING),
                members[1]: ("member", TaskState.CANCELLED),
                members[2]: ("member", TaskState.PENDING),
                callback: ("total", TaskState.WAITING),
            }
            assert graph.counts == {"pending": 2, "waiting": 1, "cancelled": 1}
            assert graph.ids(TaskState.PENDING) == [members[0], members[2]]


async def test_a_chains_layers_follow_the_longest_path(app: conveyor.App) -> None:
    t = _tasks(app)
    async with app:
        links = await chain(*(t["member"].s(n=n) for n in range(4))).enqueue_async()
        ids = [link.id for link in links.links]
        # a task after the first and the last link: its layer is the longest path
        late = await t["total"].options(after=[ids[0], ids[3]]).enqueue_async()
        graph = await app.graph_async(ids[2])
        assert _shape(graph) == [[ids[0]], [ids[1]], [ids[2]], [ids[3]], [late.id]]
        assert [n.layer for n in graph.nodes] == [0, 1, 2, 3, 4]
        assert len(graph.edges) == 5


async def test_a_task_without_edges_and_a_group_without_a_callback(app: conveyor.App) -> None:
    t = _tasks(app)
    async with app:
        alone = await t["member"].enqueue_async(n=1)
        members = await group(t["member"].s(n=n) for n in range(3)).enqueue_async()
        graph = await app.graph_async(alone.id)
        assert _shape(graph) == [[alone.id]] and graph.edges == [] and graph.roots == [alone.id]
        assert graph.counts == {"pending": 1}
        # a group without a callback has no edge: its members are not one component
        assert _shape(await app.graph_async(members.ids[0])) == [[members.ids[0]]]
        with pytest.raises(TaskNotFoundError):
            await app.graph_async(alone.id + 1000)
        with pytest.raises(TaskNotFoundError):
            await app.graph_async(0)
        with pytest.raises(ConfigurationError):
            await app.graph_async(alone.id, limit=0)


async def test_the_walk_stops_at_its_limit_keeping_the_nearest_nodes(app: conveyor.App) -> None:
    t = _tasks(app)
    async with app:
        links = await chain(*(t["member"].s(n=n) for n in range(6))).enqueue_async()
        ids = [link.id for link in links.links]
        graph = await app.graph_async(ids[2], limit=3)
        assert graph.truncated
        assert _shape(graph) == [[ids[1]], [ids[2]], [ids[3]]]
        assert [(e.dependent, e.dependency) for e in graph.edges] == [
            (ids[2], ids[1]),
            (ids[3], ids[2]),
        ]
        whole = await app.graph_async(ids[2], limit=6)
        assert not whole.truncated and len(whole.nodes) == 6


async def test_truncation_keeps_the_edges_between_the_last_nodes_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Three tasks after one, the second of them also after the first: cut
    at three nodes, the edge between the two kept dependents is there,
    though the walk read no level past them; and reads of more ids than one
    read takes go in chunks (here of 2)."""
    monkeypatch.setattr("conveyor.graph.MAX_READ_IDS", 2)
    app = conveyor.App("memory://")
    t = _tasks(app)
    async with app:
        first = await t["member"].enqueue_async(n=0)
        b = await t["member"].options(after=[first]).enqueue_async(n=1)
        c = await t["member"].options(after=[first, b]).enqueue_async(n=2)
        d = await t["member"].options(after=[first]).enqueue_async(n=3)
        graph = await app.graph_async(first.id, limit=3)
        assert graph.truncated
        assert _shape(graph) == [[first.id], [b.id], [c.id]]
        assert [(e.dependent, e.dependency) for e in graph.edges] == [
            (b.id, first.id),
            (c.id, first.id),
            (c.id, b.id),
        ]
        handle = await chord([t["member"].s(n=n) for n in range(7)], t["total"].s()).enqueue_async()
        whole = await app.graph_async(handle.callback.id)
        assert not whole.truncated
        assert _shape(whole) == [handle.group.ids, [handle.callback.id]]
        assert len(whole.edges) == 7
        assert (await app.graph_async(d.id)).counts == {"pending": 1, "waiting": 3}
    app.close()
