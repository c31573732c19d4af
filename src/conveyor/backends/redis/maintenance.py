"""Retention on Redis: prune, and the counts of what prune would delete.

A mixin of :class:`~conveyor.backends.redis.backend.RedisBackend`. Both are
one script (``prune.lua``, ``count_prunable.lua``), served by the index of
finished tasks by finish time (``lua/lib/maintenance.lua``). Scripts do
not overlap, so a prune is never ``busy``.
"""

from __future__ import annotations

from conveyor.backends.redis import rows
from conveyor.backends.redis.store import RedisStore
from conveyor.records import PruneParams, PruneResult


class Maintenance(RedisStore):
    """Prune and its counts."""

    async def prune(self, params: PruneParams) -> PruneResult:
        """Delete one batch in one script (``prune.lua``): finished tasks past
        their state's cutoff, at most ``limit``, state by state in the order
        given, each with its attempt log, inbox, send keys and unique key,
        never a child of a live parent; and old workers. Within a state the
        oldest *finish* goes first (ids break ties): the other backends take
        the lowest ids first, so one batch may differ from theirs, never
        what a prune run to the end deletes. Never ``busy``: scripts do not
        overlap."""
        found = await self._run("prune", rows.prune_args(params))
        return PruneResult(tasks=int(found[0]), workers=int(found[1]))

    async def count_prunable(self, params: PruneParams) -> PruneResult:
        """What :meth:`prune` would delete over all its batches (one script,
        reads only)."""
        found = await self._run("count_prunable", rows.prune_args(params)[1:])
        return PruneResult(tasks=int(found[0]), workers=int(found[1]))
