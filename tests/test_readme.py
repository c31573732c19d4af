"""The README's Python examples, run as written.

Each Python block of the README starts with a comment naming its file: a
block that is a whole file is written out and run (the quick start with a
real ``conveyor worker``, the test example under pytest with conveyor's
plugin); an excerpt must be, character for character, part of the example
file it names, which tests/test_examples.py runs.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"^```python\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def blocks() -> dict[str, str]:
    """Each Python block by its first line (the comment naming its file)."""
    found = {}
    for code in BLOCK.findall((ROOT / "README.md").read_text()):
        header, _, body = code.partition("\n")
        assert header.startswith("# "), f"a README block names no file: {code[:60]!r}"
        found[header[2:]] = body
    return found


def named(prefix: str) -> str:
    [body] = [body for header, body in blocks().items() if header.startswith(prefix)]
    return body


def clean_env() -> dict[str, str]:
    """A user's environment: no URL, so the default SQLite file is used."""
    return {k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")}


def test_excerpts_are_the_examples_that_run() -> None:
    excerpts = {h: b for h, b in blocks().items() if h.endswith("(excerpt)")}
    assert len(excerpts) >= 2
    for header, body in excerpts.items():
        source = (ROOT / header.removesuffix(" (excerpt)")).read_text()
        assert body in source, f"the README's excerpt of {header} is not in it"


@pytest.mark.slow
def test_the_quick_start_runs_with_a_real_worker(tmp_path: Path) -> None:
    (tmp_path / "tasks.py").write_text(named("tasks.py"))
    (tmp_path / "main.py").write_text(named("main.py"))
    env = clean_env()
    worker = subprocess.Popen(
        [sys.executable, "-m", "conveyor.cli", "worker", "tasks:app"],
        cwd=tmp_path,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        done = subprocess.run(
            [sys.executable, "main.py"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "sent"
    finally:
        worker.send_signal(signal.SIGTERM)
        log = worker.communicate(timeout=60)[1]
    assert worker.returncode == 0, log
    assert f"sqlite:///{tmp_path / 'conveyor.db'}" in log.splitlines()[0]
    listing = subprocess.run(
        [sys.executable, "-m", "conveyor.cli", "tasks", "--json"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    queues = sorted(t["queue"] for t in json.loads(listing.stdout))
    assert queues == ["default", "mail"]  # the delayed one waits on its own queue


def test_the_testing_example_passes_under_pytest(tmp_path: Path) -> None:
    (tmp_path / "tasks.py").write_text(named("tasks.py"))
    (tmp_path / "test_tasks.py").write_text(named("test_tasks.py"))
    (tmp_path / "pytest.ini").write_text("[pytest]\nconveyor_app = tasks:app\n")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout
    assert not (tmp_path / "conveyor.db").exists()  # the test ran on a memory store
