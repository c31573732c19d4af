"""How the Redis backend connects: one place for its clients' options.

- A connection attempt gives up after ``CONNECT_TIMEOUT`` seconds (a server
  that is down, or a network that swallows packets, fails the call with
  BackendUnavailableError instead of hanging).
- A command gives up after ``COMMAND_TIMEOUT`` seconds without an answer (a
  connection silenced mid-call); the worker's own deadlines (a lease, a
  heartbeat interval) are shorter and end its calls first. Every script
  works on bounded batches, far below it.
- TCP keepalives find a peer that vanished on an idle connection.
- The wake-up listener's connection waits without a command timeout (it is
  silent until something is published); its keepalives find a dead peer,
  and workers poll as well.
- Replies are decoded as UTF-8 with ``surrogateescape``: a stored value
  that is not UTF-8 (written around conveyor) reads with its bad bytes as
  lone surrogates instead of failing the whole reply (a claim of many
  tasks, a listing); :mod:`.rows` sets such a task aside, or shows it as
  corrupt.
"""

from __future__ import annotations

import redis.asyncio as aioredis

CONNECT_TIMEOUT = 10.0
COMMAND_TIMEOUT = 60.0
ENCODING_ERRORS = "surrogateescape"


def client(url: str) -> aioredis.Redis:
    """A client for commands and scripts, decoding replies as text."""
    return aioredis.Redis.from_url(
        url,
        decode_responses=True,
        encoding_errors=ENCODING_ERRORS,
        socket_connect_timeout=CONNECT_TIMEOUT,
        socket_timeout=COMMAND_TIMEOUT,
        socket_keepalive=True,
    )


def listener(url: str) -> aioredis.Redis:
    """A client for the wake-up subscription: no command timeout."""
    return aioredis.Redis.from_url(
        url,
        decode_responses=True,
        encoding_errors=ENCODING_ERRORS,
        socket_connect_timeout=CONNECT_TIMEOUT,
        socket_keepalive=True,
    )
