"""The chaos harness reports a worker that ignores SIGTERM instead of waiting for it."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from tools.chaos.checker import read_events
from tools.chaos.harness import SMOKE, Workers

IGNORES_SIGTERM = (
    "import pathlib, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "signal.signal(signal.SIGUSR1, lambda *_: pathlib.Path(sys.argv[1]).write_text('dumped')); "
    "print('ready', flush=True); time.sleep(120)"
)


def test_a_worker_that_ignores_sigterm_is_recorded_hung_and_killed(tmp_path: Path) -> None:
    workers = Workers({}, SMOKE, tmp_path)
    told = tmp_path / "told"
    proc = subprocess.Popen(
        [sys.executable, "-c", IGNORES_SIGTERM, str(told)], stdout=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    proc.stdout.close()
    workers.procs.append(proc)
    started = time.monotonic()
    codes = workers.stop_all(timeout=0.5)
    assert codes == [-signal.SIGKILL]
    assert time.monotonic() - started < 60  # the py-spy dump is bounded too
    events = [(e.event, e.pid) for e in read_events(workers.faults.read_text().splitlines())]
    assert events == [("term", proc.pid), ("hung", proc.pid), ("kill", proc.pid)]
    assert told.read_text() == "dumped"  # asked to log its state before the kill


def test_a_worker_that_exits_is_not_hung(tmp_path: Path) -> None:
    workers = Workers({}, SMOKE, tmp_path)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    workers.procs.append(proc)
    assert workers.stop_all(timeout=30) == [-signal.SIGTERM]
    events = [e.event for e in read_events(workers.faults.read_text().splitlines())]
    assert events == ["term"]
