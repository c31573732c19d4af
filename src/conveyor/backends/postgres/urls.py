"""PostgreSQL URLs: conveyor's own options, and the connect timeout.

conveyor reads two query items of a ``postgresql://`` URL itself and
removes them before libpq sees the URL (libpq refuses names it does not
know):

- ``pool_mode=transaction`` says the URL reaches PostgreSQL through a
  connection pooler in transaction mode (PgBouncer's ``pool_mode =
  transaction``), where consecutive transactions of one client connection
  may run on different server sessions. conveyor then keeps no state in a
  session: no server-side prepared statements, no session settings (see
  :mod:`.pools` for where they come from instead), no session advisory
  lock, no LISTEN through the pooler. ``pool_mode=session`` (the default)
  is a direct connection or a pooler in session mode.
- ``listen=HOST:PORT`` (or ``HOST:PORT/DBNAME``; HOST may be a name, an
  IPv6 address in brackets or a unix socket directory) names where the LISTEN
  connection and the wake-up turns connect, with the URL's user, password
  and other parameters: the server itself, past the pooler. Without it,
  a URL in transaction mode listens nowhere: workers find work by polling
  (every ``poll_interval``), take no turns and are handed nothing off.

``connect_timeout`` is libpq's own URL parameter
(``postgresql://host/db?connect_timeout=10``): it bounds each connection
attempt, and conveyor also gives up opening a backend after it. Without
it, conveyor uses ``DEFAULT_CONNECT_TIMEOUT``.

Every option is checked when the backend is built, before any I/O; a
value that breaks its rule raises ``ConfigurationError`` naming it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import quote, urlsplit, urlunsplit

import psycopg
from psycopg.conninfo import conninfo_to_dict

from conveyor.backends.urlquery import without
from conveyor.errors import ConfigurationError
from conveyor.redaction import redact_message

DEFAULT_CONNECT_TIMEOUT = 5
"""Seconds to connect before giving up, unless the URL sets ``connect_timeout``."""

POOL_MODES = ("session", "transaction")
"""The values of ``pool_mode``."""

_OWN = ("pool_mode", "listen")
_ADDRESS = re.compile(
    # A host name (underscores too: container and service names), an IPv6
    # address in brackets (with a zone id), or a unix socket directory.
    r"(?P<host>\[[0-9A-Fa-f:.]+(?:%[A-Za-z0-9_.-]{1,64})?\]"
    r"|[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,252})|/[A-Za-z0-9_./-]{0,250})"
    r":(?P<port>[0-9]{1,5})(?:/(?P<dbname>[A-Za-z0-9_.$-]{1,63}))?"
)
_SHOWN = re.compile(r"[A-Za-z0-9_.:/\[\]%$-]{0,80}")
"""What a refused value may hold to be quoted in the error: no ``@``, no
``=``, nothing that could be (or end) a password written in the wrong place."""


@dataclass(frozen=True)
class Target:
    """Where a backend connects: ``url`` for every statement (conveyor's
    options removed), ``listen_url`` for LISTEN and the wake-up turns (None:
    nowhere), and whether ``url`` goes through a pooler in transaction mode."""

    url: str
    listen_url: str | None
    transaction_pooling: bool


def target(url: str) -> Target:
    """The :class:`Target` of a PostgreSQL URL (see the module's docstring)."""
    if not url.startswith(("postgresql://", "postgres://")):
        return Target(url, url, transaction_pooling=False)
    # The other items go to libpq as they were written (it decodes them).
    libpq, own = without(url, _OWN)
    if not own:
        return Target(url, url, transaction_pooling=False)
    mode = own.get("pool_mode", "session")
    if mode not in POOL_MODES:
        raise ConfigurationError(
            f"pool_mode must be one of {', '.join(POOL_MODES)}, not {_shown(mode)}"
        )
    pooled = mode == "transaction"
    address = own.get("listen")
    if address is None:
        return Target(libpq, None if pooled else libpq, transaction_pooling=pooled)
    return Target(libpq, _elsewhere(libpq, address), transaction_pooling=pooled)


def _shown(value: str) -> str:
    """``value`` quoted for an error, or only its length where it might
    hold a secret (a password put in the wrong option)."""
    if _SHOWN.fullmatch(value):
        return repr(value)
    return f"a value of {len(value)} characters"


def _elsewhere(url: str, address: str) -> str:
    """``url`` with its host and port (and database, if ``address`` names
    one) replaced by ``address``'s."""
    found = _ADDRESS.fullmatch(address)
    if found is None or not 0 < int(found["port"]) < 65536:
        raise ConfigurationError(
            f"listen must be HOST:PORT or HOST:PORT/DBNAME, not {_shown(address)}"
        )
    parts = urlsplit(url)
    userinfo, at, _ = parts.netloc.rpartition("@")
    # A socket directory and a zone id's "%" go percent-encoded in the host.
    host = (
        quote(found["host"], safe="[]:")
        if not found["host"].startswith("[")
        else (found["host"].replace("%", "%25"))
    )
    netloc = f"{userinfo}{at}{host}:{found['port']}"
    path = f"/{found['dbname']}" if found["dbname"] else parts.path
    # Query items that would name another server (or database) go too.
    replaced = {"host", "hostaddr", "port"} | ({"dbname"} if found["dbname"] else set())
    elsewhere, _ = without(urlunsplit(parts._replace(netloc=netloc, path=path)), replaced)
    return elsewhere


def connect_timeout(url: str) -> int:
    """The URL's ``connect_timeout`` (whole seconds, at least 2, as libpq
    counts them), else ``DEFAULT_CONNECT_TIMEOUT``. ``url`` is a
    :attr:`Target.url` (conveyor's options removed)."""
    try:
        value = conninfo_to_dict(url).get("connect_timeout")
    except psycopg.ProgrammingError as exc:
        # libpq's reason can quote a piece of the password.
        reason = redact_message(str(exc).strip(), url)
        raise ConfigurationError(f"invalid PostgreSQL URL: {reason}") from None
    if value is None:
        return DEFAULT_CONNECT_TIMEOUT
    try:
        seconds = int(str(value))
    except ValueError:
        raise ConfigurationError(f"connect_timeout must be whole seconds, not {value!r}") from None
    if seconds <= 0:
        raise ConfigurationError("connect_timeout must be at least 1 second")
    return max(seconds, 2)
