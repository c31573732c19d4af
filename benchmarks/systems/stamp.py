"""Where a benchmark handler records when it started, for enqueue-to-start latency.

The enqueuing side takes ``time.time()`` just before its enqueue call and
carries it in the payload (``sent``); the handler, in a worker process on the
same machine, appends ``sent started`` to the file named by
``BENCH_STAMP_FILE``. One short ``O_APPEND`` write per line, so lines from
several processes do not interleave.

Peers that keep no start and finish times of their own (``redis_peers.py``
says which) have their no-op handler append ``i started finished`` to the
file named by ``BENCH_RECORD_FILE`` the same way (:func:`record_run`): the
drain's count and window come from there.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

STAMP_ENV = "BENCH_STAMP_FILE"
RECORD_ENV = "BENCH_RECORD_FILE"
WARM_UP = -1.0
"""The ``sent`` value of the warm-up task, left out of the latencies."""

_fds: dict[str, int] = {}
"""The file each environment variable names, opened for appending once."""


def _append(env: str, line: str) -> None:
    """One ``O_APPEND`` write of ``line`` to the file ``env`` names (no-op without one)."""
    fd = _fds.get(env)
    if fd is None:
        path = os.environ.get(env)
        if not path:
            return
        fd = _fds[env] = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, line.encode())


def record_start(sent: float) -> None:
    """Append ``sent`` and this moment to the stamp file (no-op without one)."""
    _append(STAMP_ENV, f"{sent!r} {time.time()!r}\n")


def read_stamps(path: Path) -> list[tuple[float, float]]:
    """The ``(sent, started)`` pairs written so far, warm-up included."""
    try:
        text = path.read_text(encoding="ascii")
    except FileNotFoundError:
        return []
    pairs = []
    for line in text.splitlines():
        sent, started = line.split()
        pairs.append((float(sent), float(started)))
    return pairs


def latencies(path: Path) -> list[float]:
    """Enqueue-to-start seconds of every stamped task but the warm-up, sorted."""
    return sorted(started - sent for sent, started in read_stamps(path) if sent != WARM_UP)


def record_run(i: int, started: float) -> None:
    """Append task ``i``, its handler's start and this moment (its finish) to
    the record file (no-op without one)."""
    _append(RECORD_ENV, f"{i} {started!r} {time.time()!r}\n")


def count_records(path: Path) -> int:
    """Lines in the record file so far: cheap, for polling (repeats included)."""
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def read_records(path: Path) -> tuple[set[int], float | None, float | None]:
    """The distinct tasks recorded, the first start and the last finish."""
    done: set[int] = set()
    first: float | None = None
    last: float | None = None
    try:
        text = path.read_text(encoding="ascii")
    except FileNotFoundError:
        return done, first, last
    for line in text.splitlines():
        i, started, finished = line.split()
        done.add(int(i))
        first = float(started) if first is None else min(first, float(started))
        last = float(finished) if last is None else max(last, float(finished))
    return done, first, last
