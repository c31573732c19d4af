"""The two indexes a claim of the memory store reads."""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from conveyor.backends.memory.rows import Row
from conveyor.model import TaskState

Entry = tuple[int, datetime, int]
"""A pending task's place in its queue: priority desc, run_at, id."""


def claim_order(row: Row) -> Entry:
    return (-row.priority, row.run_at, row.id)


@dataclass
class ClaimIndex:
    """Per queue, a heap of pending tasks in claim order, and the set of
    tasks in progress. A heap entry is checked against its row when popped
    (a stale one is dropped), so a state change never has to find and
    remove it: :meth:`update` only adds."""

    pending: dict[str, list[Entry]] = field(default_factory=dict)
    in_progress: set[int] = field(default_factory=set)
    keyed_pending: dict[str, set[int]] = field(default_factory=dict)
    """Pending tasks with a concurrency key (not in ``pending``), by key."""
    keyed_running: dict[str, set[int]] = field(default_factory=dict)
    """Tasks in progress with a concurrency key, by key."""

    def update(self, row: Row) -> None:
        """Index ``row`` in the state it just took (a pending one at its run_at)."""
        if row.state is TaskState.IN_PROGRESS:
            self.in_progress.add(row.id)
        else:
            self.in_progress.discard(row.id)
        key = row.concurrency_key
        if key is not None:
            self._file(self.keyed_pending, key, row.id, row.state is TaskState.PENDING)
            self._file(self.keyed_running, key, row.id, row.state is TaskState.IN_PROGRESS)
        elif row.state is TaskState.PENDING:
            heapq.heappush(self.pending.setdefault(row.queue, []), claim_order(row))

    def forget(self, row: Row) -> None:
        """``row`` is deleted."""
        self.in_progress.discard(row.id)
        if row.concurrency_key is not None:
            self._file(self.keyed_pending, row.concurrency_key, row.id, False)
            self._file(self.keyed_running, row.concurrency_key, row.id, False)

    @staticmethod
    def _file(by_key: dict[str, set[int]], key: str, task_id: int, present: bool) -> None:
        if present:
            by_key.setdefault(key, set()).add(task_id)
        elif key in by_key:
            by_key[key].discard(task_id)
            if not by_key[key]:
                del by_key[key]

    def due(
        self, tasks: Mapping[int, Row], queue: str, names: set[str], now: datetime, limit: int
    ) -> list[Row]:
        """The head of ``queue``'s due pending tasks of ``names`` without a
        concurrency key (keyed ones are claimed by key: :mod:`.keys`), in claim order.

        Every valid entry popped goes back: the caller decides which rows it
        hands out, and those entries are dropped as stale later."""
        heap = self.pending.get(queue)
        if not heap:
            return []
        found: list[Row] = []
        kept: list[Entry] = []
        while heap and len(found) < limit:
            entry = heapq.heappop(heap)
            row = tasks.get(entry[2])
            stale = row is None or row.state is not TaskState.PENDING or claim_order(row) != entry
            if stale or (kept and kept[-1] == entry):  # moved on, or a duplicate
                continue
            kept.append(entry)
            if row is not None and row.run_at <= now and row.name in names:
                found.append(row)
        for entry in kept:
            heapq.heappush(heap, entry)
        return found
