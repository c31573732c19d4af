"""The examples are runnable: each is executed as a user would run it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_quickstart_prints_its_results(pg_url: str, schema: str) -> None:
    env = {**os.environ, "CONVEYOR_URL": pg_url, "CONVEYOR_SCHEMA": schema}
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "quickstart.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["hello, world", "DURABLE"]
