"""The graph of dependencies around a task: :func:`task_graph`.

A task's graph is the connected component of the edges of ``after``
around it (each edge: a dependent waits for a dependency): a chord's
members and its callback, a chain's links, a DAG's tasks, whichever of
them the walk starts from. The walk reads it level by level, one batched
read of edges per level (:meth:`~conveyor.backends.protocol.Backend.edges`,
in chunks of :data:`~conveyor.backends.params.MAX_READ_IDS` ids), then the
nodes' names and states in batched summaries
(:meth:`~conveyor.backends.capabilities.Inspector.summaries`).

Limits: the graph is read in several reads, not one transaction, so a task
may move on (or an enqueue add edges) between them. The walk stops at
``limit`` nodes (``truncated``): the nodes nearest the task are kept, and
the edges between kept nodes; a kept node whose dependencies were left out
is then drawn as a root. A group without a callback has no edge: each of
its members is a graph of one node (its handle holds their ids). A
dependency no longer stored is a node with no name and no state.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass

from conveyor.backends.capabilities import capability_of
from conveyor.backends.params import MAX_READ_IDS
from conveyor.backends.protocol import Backend, Capability
from conveyor.errors import ConfigurationError, TaskNotFoundError
from conveyor.model import TaskState, stored_id
from conveyor.records import DependencyEdge

DEFAULT_LIMIT = 10_000
"""The most nodes :func:`task_graph` reads by default."""
DELETED = "deleted"
"""How :attr:`TaskGraph.counts` names the nodes no longer stored."""


@dataclass(frozen=True, slots=True)
class GraphNode:
    """One task of a graph: its id, name and state (None for both: the task
    is no longer stored, only an edge to it is), and its ``layer``: the
    length of the longest path of edges to it from a root (0: a root, a
    task that waits for no task of the graph)."""

    id: int
    name: str | None
    state: TaskState | None
    layer: int


@dataclass(frozen=True, slots=True)
class TaskGraph:
    """The graph of dependencies around task ``task_id`` (see the module
    docstring): its nodes by layer then id, its edges by dependent then
    position, and whether the walk stopped at its limit (``truncated``)."""

    task_id: int
    nodes: list[GraphNode]
    edges: list[DependencyEdge]
    truncated: bool

    @property
    def roots(self) -> list[int]:
        """The ids of the nodes that wait for no node of the graph, ascending."""
        return [node.id for node in self.nodes if node.layer == 0]

    @property
    def layers(self) -> list[list[GraphNode]]:
        """The nodes of each layer, from the roots on, each by id."""
        found: list[list[GraphNode]] = []
        for node in self.nodes:
            while len(found) <= node.layer:
                found.append([])
            found[node.layer].append(node)
        return found

    @property
    def counts(self) -> dict[str, int]:
        """How many nodes are in each state (by its value, in the order of
        :class:`TaskState`; :data:`DELETED` for those no longer stored),
        states without a node left out."""
        found = Counter(DELETED if n.state is None else n.state.value for n in self.nodes)
        order = [s.value for s in TaskState] + [DELETED]
        return {name: found[name] for name in order if found[name]}

    def ids(self, *states: TaskState) -> list[int]:
        """The ids of the nodes in ``states``, ascending."""
        return sorted(node.id for node in self.nodes if node.state in states)


async def task_graph(backend: Backend, task_id: int, limit: int = DEFAULT_LIMIT) -> TaskGraph:
    """The graph of dependencies around task ``task_id``, at most ``limit``
    nodes (see the module docstring): one read of edges per level of the
    walk (more for a level past ``MAX_READ_IDS`` ids), then one read of
    summaries per ``MAX_READ_IDS`` nodes. A task without edges is a graph of
    one node. Raises TaskNotFoundError for a task not stored, and
    ConfigurationError for a ``limit`` below 1 or a backend without an
    inspector."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ConfigurationError("limit must be an integer, at least 1")
    inspector = capability_of(backend, Capability.INSPECT)
    if inspector is None:
        raise ConfigurationError("this backend has no read side (INSPECT): no graph to read")
    stored_id(task_id)
    kept, edges, truncated = await _walk(backend, task_id, limit)
    names: dict[int, tuple[str, TaskState]] = {}
    ordered = sorted(kept)
    for chunk in _chunks(ordered):
        names.update((s.id, (s.name, s.state)) for s in await inspector.summaries(chunk))
    if task_id not in names:
        raise TaskNotFoundError(f"no task with id {task_id}")
    layers = _layers(ordered, edges)
    nodes = []
    for i in sorted(ordered, key=lambda i: (layers[i], i)):
        name, state = names.get(i, (None, None))
        nodes.append(GraphNode(i, name, state, layers[i]))
    return TaskGraph(task_id, nodes, edges, truncated)


async def _walk(
    backend: Backend, task_id: int, limit: int
) -> tuple[set[int], list[DependencyEdge], bool]:
    """The nodes of the component around ``task_id``, level by level, at
    most ``limit``; the edges between them; whether some were left out
    (then the edges of the last nodes kept are read once more, for those
    between kept nodes)."""
    kept = {task_id}
    found: dict[tuple[int, int], DependencyEdge] = {}
    frontier = [task_id]
    truncated = False
    while frontier:
        level: list[DependencyEdge] = []
        for chunk in _chunks(frontier):
            level += await backend.edges(chunk)
        frontier = []
        for edge in level:
            for end in (edge.dependency, edge.dependent):
                if end in kept:
                    continue
                if len(kept) >= limit:
                    truncated = True
                    continue
                kept.add(end)
                frontier.append(end)
            if edge.dependent in kept and edge.dependency in kept:
                found[(edge.dependent, edge.position)] = edge
        if truncated:
            for chunk in _chunks(frontier):
                for edge in await backend.edges(chunk):
                    if edge.dependent in kept and edge.dependency in kept:
                        found[(edge.dependent, edge.position)] = edge
            break
    return kept, sorted(found.values(), key=lambda e: (e.dependent, e.position)), truncated


def _layers(nodes: Sequence[int], edges: Sequence[DependencyEdge]) -> dict[int, int]:
    """Each node's layer: the longest path of edges to it from a node that
    waits for none (Kahn's order; the edges form no cycle, as
    ``check_after`` keeps every enqueue from making one)."""
    waits_for: Counter[int] = Counter()
    dependents: dict[int, list[int]] = {}
    for edge in edges:
        waits_for[edge.dependent] += 1
        dependents.setdefault(edge.dependency, []).append(edge.dependent)
    layer = dict.fromkeys(nodes, 0)
    ready = deque(n for n in nodes if not waits_for[n])
    while ready:
        node = ready.popleft()
        for dependent in dependents.get(node, ()):
            layer[dependent] = max(layer[dependent], layer[node] + 1)
            waits_for[dependent] -= 1
            if not waits_for[dependent]:
                ready.append(dependent)
    return layer


def _chunks(ids: Sequence[int]) -> list[Sequence[int]]:
    return [ids[start : start + MAX_READ_IDS] for start in range(0, len(ids), MAX_READ_IDS)]
