"""Runs the real ``conveyor`` command in a subprocess, on the test's store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


class Cli:
    """Runs ``python -m conveyor.cli`` with the test's URL and schema."""

    def __init__(self, url: str, schema: str) -> None:
        self.env = {**os.environ, "CONVEYOR_URL": url, "CONVEYOR_SCHEMA": schema}

    def run(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "conveyor.cli", *args],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def ok(self, *args: str, timeout: float = 30) -> str:
        done = self.run(*args, timeout=timeout)
        assert done.returncode == 0, f"{args} exited {done.returncode}: {done.stderr}"
        return done.stdout

    def fails(self, *args: str) -> str:
        """Run a command that must fail; return its one-line error."""
        done = self.run(*args)
        assert done.returncode != 0, f"{args} should fail; printed {done.stdout!r}"
        assert done.stdout == ""
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, f"expected a one-line error, got {done.stderr!r}"
        assert lines[0].startswith("error: ")
        return lines[0]

    def usage_error(self, *args: str) -> str:
        """Run a malformed command line; return click's ``Error:`` line."""
        done = self.run(*args)
        assert done.returncode == 2, f"{args} exited {done.returncode}: {done.stderr}"
        assert done.stdout == ""
        [line] = [x for x in done.stderr.splitlines() if x.startswith("Error: ")]
        return line

    def json(self, *args: str) -> Any:
        return json.loads(self.ok(*args, "--json"))

    def enqueue(self, name: str, args: dict[str, Any] | None = None, *options: str) -> int:
        data = self.json("enqueue", name, "--args", json.dumps(args or {}), *options)
        assert set(data) == {"id"}
        assert isinstance(data["id"], int)
        return int(data["id"])

    def show(self, task_id: int) -> dict[str, Any]:
        data = self.json("show", str(task_id))
        assert isinstance(data, dict)
        return data
