"""``conveyor dashboard``: the real command, served by uvicorn in a process
of its own, on each store the CLI tests use."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.error
import urllib.request

from tests.cli_harness import ROOT, Cli
from tools.redis_server import free_port


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
