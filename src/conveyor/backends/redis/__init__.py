"""The Redis backend (``redis://HOST:PORT/DB``, ``rediss://``; a key prefix).

Needs the ``redis`` extra (``pip install 'conveyor[redis]'``): redis-py is
imported only inside this package. Every state change is one Lua script
(``lua/``, one file per operation), run atomically by the server; the
server's clock rules leases and due times. ``keys`` lays out the keys,
``scripts`` loads and runs the Lua, ``rows`` maps stored values to domain
objects, ``listen`` serves the wake-ups, ``connect`` and ``persistence``
make and check the connection. :class:`RedisBackend` (``backend``: its
docstring states what it guarantees and what it does not do yet) is one
mixin per section over ``store`` (the client, the prefix, the scripts):
``schema`` (the layout check), ``enqueue``, ``attempts``, ``messages``,
``controls``, ``flow``, ``workers``, ``maintenance`` and ``reads``.

:func:`conveyor.backends.backend_from_url` builds it for ``redis://`` and
``rediss://`` URLs; the key prefix is ``?prefix=NAME`` or the App's
``schema``.
"""

from conveyor.backends.redis.backend import RedisBackend

__all__ = ["RedisBackend"]
