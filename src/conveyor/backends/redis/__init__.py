"""The Redis backend (``redis://HOST:PORT/DB``, ``rediss://``; a key prefix).

Needs the ``redis`` extra (``pip install 'conveyor[redis]'``): redis-py is
imported only inside this package. Every state change is one Lua script
(``lua/``, one file per operation), run atomically by the server; the
server's clock rules leases and due times. ``keys`` lays out the keys,
``scripts`` loads and runs the Lua, ``rows`` maps stored values to domain
objects, ``listen`` serves the wake-ups. :class:`RedisBackend` (``backend``:
the task lifecycle; its docstring states what it guarantees and what it
does not do yet) is built on ``store`` (the connection, the layout check),
``control`` (operator controls, messages, retention, schedules, pauses,
workers) and ``inspector`` (the reads, with ``reads``).

:func:`conveyor.backends.backend_from_url` builds it for ``redis://`` and
``rediss://`` URLs; the key prefix is ``?prefix=NAME`` or the App's
``schema``.
"""

from conveyor.backends.redis.backend import RedisBackend

__all__ = ["RedisBackend"]
