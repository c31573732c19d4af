"""A PgBouncer of its own, in front of a PostgreSQL server (tests, benchmarks, chaos runs).

``Bouncer`` writes a configuration in a temporary directory, starts Debian's
``pgbouncer`` on a free port of 127.0.0.1 in transaction mode, and stops it
(SIGINT: at once, dropping its connections). ``restart()`` stops it and
starts it again on the same port, as an operator's restart would: every
client connection is cut. The bouncer sets, on each server connection it
opens, the session settings conveyor would set itself (``connect_query``),
trusts every user (as the test server does) and runs as the ``postgres``
user when started by root (PgBouncer refuses to run as root).

``url`` is the bouncer's URL with conveyor's options (``pool_mode=transaction``
and ``listen`` naming the server itself); ``plain_url`` without them.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

from conveyor.backends.urlquery import without

DEFAULT_UPSTREAM = "postgresql://127.0.0.1:5432/test"
START_TIMEOUT = 10.0
SETTINGS = (
    "set jit to off; set enable_seqscan to off; "
    "set idle_in_transaction_session_timeout to ''1s''; "
    "set default_transaction_isolation to ''read committed''"
)


def available() -> bool:
    """Whether a ``pgbouncer`` executable is on the PATH."""
    return shutil.which("pgbouncer") is not None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Bouncer:
    """One PgBouncer process in transaction mode (see the module's docstring).

    ``pool_size`` is its server connections per database and user;
    ``max_client_conn`` the client connections it accepts; ``connect_query``
    what it runs on each server connection it opens (None: nothing), with
    its single quotes doubled."""

    def __init__(
        self,
        upstream: str = DEFAULT_UPSTREAM,
        *,
        pool_size: int = 20,
        max_client_conn: int = 2000,
        connect_query: str | None = SETTINGS,
    ) -> None:
        parts = urlsplit(upstream)
        self.upstream_host = parts.hostname or "127.0.0.1"
        self.upstream_port = parts.port or 5432
        self.dbname = parts.path.lstrip("/") or "postgres"
        self.user = parts.username or pwd.getpwuid(os.getuid()).pw_name
        self.port = _free_port()
        self.pool_size = pool_size
        self.max_client_conn = max_client_conn
        self.connect_query = connect_query
        self._dir = Path(tempfile.mkdtemp(prefix="conveyor-bouncer-"))
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def plain_url(self) -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{self.dbname}"

    @property
    def url(self) -> str:
        host = f"[{self.upstream_host}]" if ":" in self.upstream_host else self.upstream_host
        return f"{self.polling_url}&listen={host}:{self.upstream_port}"

    @property
    def polling_url(self) -> str:
        """Through it in transaction mode, listening nowhere (workers poll)."""
        return f"{self.plain_url}?pool_mode=transaction"

    def _write_config(self) -> Path:
        (self._dir / "users.txt").write_text(f'"{self.user}" ""\n')
        config = self._dir / "pgbouncer.ini"
        config.write_text(
            "[databases]\n"
            f"* = host={self.upstream_host} port={self.upstream_port}"
            + (f" connect_query='{self.connect_query}'" if self.connect_query else "")
            + "\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {self._dir / 'users.txt'}\n"
            "pool_mode = transaction\n"
            f"default_pool_size = {self.pool_size}\n"
            f"max_client_conn = {self.max_client_conn}\n"
            "ignore_startup_parameters = extra_float_digits,options\n"
            "log_connections = 0\n"
            "log_disconnections = 0\n"
            f"logfile = {self._dir / 'pgbouncer.log'}\n"
        )
        if os.getuid() == 0:
            shutil.chown(self._dir, "postgres")
            for path in self._dir.iterdir():
                shutil.chown(path, "postgres")
        return config

    def start(self) -> None:
        """Start it, and return once it accepts connections."""
        config = self._write_config()
        command = ["pgbouncer", str(config)]
        if os.getuid() == 0:
            command[1:1] = ["-u", "postgres"]
        self._process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                err = self._process.stderr.read().decode() if self._process.stderr else ""
                raise RuntimeError(f"pgbouncer exited at start: {err.strip()[-500:]}")
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5),
            ):
                return
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"pgbouncer did not listen on port {self.port}")

    def stop(self) -> None:
        """Stop it at once (SIGINT), cutting every connection."""
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if process.stderr is not None:
            process.stderr.close()

    def restart(self) -> None:
        """Stop it and start it again on the same port."""
        self.stop()
        self.start()

    def log(self) -> str:
        """What it logged so far (its warnings and errors)."""
        path = self._dir / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def close(self) -> None:
        """Stop it and remove its directory."""
        self.stop()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> Bouncer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def polling(url: str) -> str:
    """``url`` (a bouncer's, in transaction mode) without its ``listen`` item."""
    return without(url, ("listen",))[0]
