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
