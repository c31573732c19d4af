"""The garbage collector of a process that runs a worker.

Each attempt allocates a few dozen container objects (its asyncio task,
coroutine frames, context, completion), almost all of them freed by
reference counting as the attempt ends. CPython's collector counts them all
the same: with its default thresholds (700, 10, 10) it collects its youngest
generation every 700 net allocations, the next every tenth of those, and
the whole heap every hundredth, which traverses every object of the process
(the app, its modules, the backend's connections: some 50,000 in a worker).
A drain of 50,000 no-op tasks at concurrency 800 on PostgreSQL spent 439 ms
in the collector, about 9 µs a task, 31 ms a whole-heap collection
(docs/performance.md, Profile findings).

:func:`tune_collector` collects once, then freezes every object alive into
the permanent generation (``gc.freeze``: no collection traverses them again)
and raises the youngest generation's threshold: the same drain spent 63-114
ms, that first collection included.

Guarantees and limits:

- Garbage in reference cycles is still collected, in larger batches: up to
  ``threshold`` more container objects may wait for a collection (a few MB
  at most, for cycles that reference counting alone cannot free).
- An object that was alive at the freeze and later becomes garbage in a
  cycle is never collected (``gc.unfreeze`` gives it back): what lives at
  a worker's start (the app, the modules) lives as long as the process.
- The setting is the whole process's. ``conveyor worker`` calls this, since
  its process is the worker's (``--gc-threshold``); an embedded
  :class:`~conveyor.worker.worker.Worker` leaves the collector of the
  program it runs in alone.
"""

from __future__ import annotations

import gc

DEFAULT_THRESHOLD = 10_000
"""The youngest generation's threshold while a worker process runs: about
one collection per 500 attempts of no-op tasks, against one per 50 at
CPython's 700 (the drain above: 105 against 935)."""


def tune_collector(threshold: int = DEFAULT_THRESHOLD) -> None:
    """Collect the garbage there is, freeze what is alive, and set the
    youngest generation's threshold to ``threshold`` (the older generations
    keep theirs). ``threshold`` must be positive: 0 would switch automatic
    collection off, which this never does."""
    if threshold <= 0:
        raise ValueError(f"the collector's threshold must be positive, not {threshold}")
    gc.collect()
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(threshold, middle, oldest)
