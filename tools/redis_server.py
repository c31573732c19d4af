"""A Redis server of one's own, to configure, kill and restart (tests, chaos runs).

``RedisServer`` runs ``redis-server`` on 127.0.0.1 at a free port, with its
data directory and its persistence settings given here (AOF on, ``fsync``
before each reply, no RDB snapshots by default), so that a test may SIGKILL
it and start it again on the same port and files without touching the
shared server other tests use. ``url`` names it; a key prefix is the
caller's choice.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from pathlib import Path

START_TIMEOUT = 20.0


def free_port() -> int:
    """A TCP port nothing listens on now, on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """One ``redis-server`` process at a time, on a fixed port and directory."""

    def __init__(
        self,
        workdir: Path,
        *,
        appendonly: bool = True,
        appendfsync: str = "always",
        maxmemory_policy: str = "noeviction",
    ) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
        self.binary = binary
        self.workdir = workdir
        self.port = free_port()
        self.settings = {
            "appendonly": "yes" if appendonly else "no",
            "appendfsync": appendfsync,
            "maxmemory-policy": maxmemory_policy,
        }
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start the server (again, on the same files) and wait until it answers."""
        if self.process is not None and self.process.poll() is None:
            raise RuntimeError("the Redis server is running already")
        self.workdir.mkdir(parents=True, exist_ok=True)
        args = [self.binary, "--bind", "127.0.0.1", "--port", str(self.port)]
        args += ["--dir", str(self.workdir), "--save", ""]
        for name, value in self.settings.items():
            args += [f"--{name}", value]
        log = (self.workdir / "redis.log").open("ab")
        self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self.starts += 1
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.process.returncode}")
            if self._answers():
                return
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"redis-server did not answer on port {self.port}")

    def kill(self) -> None:
        """SIGKILL: the server ends at once, keeping only what it wrote to disk."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def stop(self) -> None:
        """End the server (SIGTERM, then SIGKILL after 10 s)."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.kill()

    def _answers(self) -> bool:
        with (
            contextlib.suppress(OSError),
            socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock,
        ):
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
        return False
