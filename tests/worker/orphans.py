"""Whether a handler process outlives its worker: the worker is a script
that prints its handler process's pid, then is SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GRACE = 10.0
"""Seconds a handler process has to see its worker gone (milliseconds
normally; a loaded machine may take longer to schedule it)."""


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def outlives_its_worker(script: str, settle: float = 0.2) -> bool:
    """Run ``script`` (it prints the pid of its handler process), SIGKILL it
    ``settle`` seconds after the pid is printed; whether the handler process
    still runs ``GRACE`` seconds later. It is killed afterwards either way."""
    worker = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE)
    child = None
    try:
        assert worker.stdout is not None
        child = int(worker.stdout.readline())
        assert alive(child)
        time.sleep(settle)
        worker.kill()
        worker.wait(10)
        deadline = time.monotonic() + GRACE
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        return alive(child)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(10)
        if worker.stdout is not None:
            worker.stdout.close()
        if child is not None and alive(child):
            os.kill(child, signal.SIGKILL)  # the orphan the test caused
