"""``conveyor demo`` runs with nothing but the package: SQLite, no server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
def test_demo_runs_on_a_temporary_sqlite_file_by_default(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")}
    env["COLUMNS"] = "200"
    done = subprocess.run(
        [sys.executable, "-m", "conveyor.cli", "demo"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()

    def row(name: str) -> str:
        found = [line for line in lines if f" {name} " in line]
        assert len(found) == 1, done.stdout
        return found[0]

    assert "on SQLite" in done.stdout
    assert "succeeded" in row("demo.greet") and "'hello, world'" in row("demo.greet")
    assert "1:failed, 2:succeeded" in row("demo.flaky")
    assert "1:failed, 2:failed" in row("demo.broken") and "ZeroDivisionError" in row("demo.broken")
    assert "1:succeeded" in row("demo.long") and "1.0s lease" in row("demo.long")
    assert "Traceback (most recent call last)" in done.stdout
    assert list(tmp_path.iterdir()) == []  # the demo's file was its own, and is gone


def test_sqlite_and_memory_never_import_psycopg(tmp_path: Path) -> None:
    """The core install (no extras) must work: only PostgreSQL needs psycopg."""
    script = f"""
import sys, conveyor
from conveyor import testing
for url in ("sqlite:///{tmp_path / "t.db"}", "memory://x"):
    app = conveyor.App(url)
    @app.task
    def double(n: int) -> int:
        return 2 * n
    handle = double.enqueue(n=4)
    testing.drain(app)
    assert handle.result(timeout=5) == 8
    app.close()
assert "psycopg" not in sys.modules, "psycopg was imported"
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
