"""``conveyor dashboard``: the real command, served by uvicorn in a process
of its own, on each store the CLI tests use."""

from __future__ import annotations

import base64
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.cli_harness import ROOT, Cli
from tools.redis_server import free_port


@contextmanager
def _serving(cli: Cli, *options: str) -> Iterator[str]:
    """``conveyor dashboard`` with ``options`` on a free port: its base URL."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "conveyor.cli", "dashboard", "--port", str(port), *options],
        cwd=ROOT,
        env={k: v for k, v in cli.env.items() if not k.startswith("CONVEYOR_DASHBOARD_")},
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                _status(f"{base}/static/dashboard.css")
                break
            except OSError:
                assert time.monotonic() < deadline and server.poll() is None, "never listened"
                time.sleep(0.1)
        yield base
    finally:
        server.terminate()
        server.wait(timeout=30)


def _status(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=5) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read().decode()


def test_the_command_serves_the_dashboard_behind_its_token(cli: Cli) -> None:
    task_id = cli.enqueue("add", {"a": 1, "b": 2})
    port = free_port()
    command = ["dashboard", "--port", str(port), "--token", "s3cret"]
    server = subprocess.Popen(
        [sys.executable, "-m", "conveyor.cli", *command],
        cwd=ROOT,
        env=cli.env,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                refused, _ = _status(f"{base}/")
                break
            except OSError:
                assert time.monotonic() < deadline and server.poll() is None, "never listened"
                time.sleep(0.1)
        assert refused == 401
        inside = {"Authorization": "Bearer s3cret"}
        status, page = _status(f"{base}/tasks/{task_id}", inside)
        assert status == 200 and "add" in page
        status, metrics = _status(f"{base}/metrics", inside)
        assert status == 200 and 'conveyor_queue_due_tasks{queue="default"} 1.0' in metrics
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_the_command_asks_for_one_way_in(cli: Cli) -> None:
    assert "exactly one of" in cli.usage_error("dashboard")
    assert "exactly one of" in cli.usage_error("dashboard", "--token", "t", "--no-auth")
    assert "USER:PASSWORD" in cli.usage_error("dashboard", "--basic", "nocolon")


def test_the_command_reads_its_secrets_from_files(cli: Cli, tmp_path: Path) -> None:
    (tmp_path / "token").write_text("from-a-file\n")
    (tmp_path / "basic").write_text("ops:pw\n")
    with _serving(cli, "--token-file", str(tmp_path / "token")) as base:
        assert _status(f"{base}/")[0] == 401
        assert _status(f"{base}/", {"Authorization": "Bearer from-a-file"})[0] == 200
        assert _status(f"{base}/", {"Authorization": "Bearer from-a-fil"})[0] == 401
    with _serving(cli, "--basic-file", str(tmp_path / "basic")) as base:
        right = base64.b64encode(b"ops:pw").decode()
        assert _status(f"{base}/", {"Authorization": f"Basic {right}"})[0] == 200
    helped = cli.ok("dashboard", "--help")
    assert "--token-file" in helped and "--basic-file" in helped and "--allowed-host" in helped
    assert "process list" in helped
    assert "exactly one of" in cli.usage_error(
        "dashboard", "--token-file", str(tmp_path / "token"), "--token", "t"
    )
    assert "cannot read" in cli.usage_error("dashboard", "--token-file", str(tmp_path / "none"))


def test_the_command_answers_only_its_host_names(cli: Cli) -> None:
    with _serving(cli, "--no-auth", "--allowed-host", "dash.example") as base:
        assert _status(f"{base}/", {"Host": "evil.example"})[0] == 400
        assert _status(f"{base}/", {"Host": "dash.example:8080"})[0] == 200
        assert _status(f"{base}/", {"Host": "localhost"})[0] == 200
        assert _status(f"{base}/")[0] == 200  # 127.0.0.1:port
    with _serving(cli, "--token", "t") as base:  # on a loopback address: this machine's names
        inside = {"Authorization": "Bearer t"}
        assert _status(f"{base}/", {**inside, "Host": "evil.example"})[0] == 400
        assert _status(f"{base}/", inside)[0] == 200
