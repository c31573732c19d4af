"""Wake-up turns on PostgreSQL: a session advisory lock per kind of worker.

A NOTIFY reaches every listening worker. The workers of one kind (the same
queues and task names) on one schema take turns at one advisory lock: the
worker that holds it answers wake-ups with a claim, the others wait for it
to be given back (see :mod:`.session`, whose connection holds it). It is a
session lock, so a worker that dies, freezes past its connection's end, or
loses the connection gives its turn back with the session. See
:mod:`conveyor.worker.turns` for when a worker takes and gives its turn.
"""

from __future__ import annotations

import hashlib


def kind_key(kind: str) -> int:
    """The lock's second key: a signed 32-bit integer drawn from ``kind``.
    Two kinds that share a key (one chance in 2^32) share turns: nothing is
    lost, but while one kind holds the turn the other's wake-ups wait for
    its workers' polls."""
    digest = hashlib.blake2b(kind.encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big", signed=True)
