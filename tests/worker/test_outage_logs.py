"""A worker that loses its database says so once per change, and recovers.

A real worker process reaches PostgreSQL through a TCP proxy that then acts
like a server that is down (every connection reset, new ones refused) for
several seconds: claims, heartbeats and completions fail dozens of times.
The log must name the cause in a few WARNING lines, not one per try, say
once that the store is back (a pooled connection closed by the reset may
cost one more call just after: a blip, said as one), and carry the driver's own lines in the same
JSON shape; the worker then runs new work.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import conveyor
from tests.cli_harness import ROOT
from tests.conftest import PG_URL
from tools.proxy import Proxy

pytestmark = pytest.mark.slow
DOWN_SECONDS = 6.0


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_a_lost_database_is_logged_once_per_change(
    proxy: Proxy, schema: str, tmp_path: Path
) -> None:
    app = conveyor.App(PG_URL, schema=schema, allow_unregistered=True)
    app.migrate()
    log = tmp_path / "worker.log"
    env = {**os.environ, "CONVEYOR_URL": proxy.url, "CONVEYOR_SCHEMA": schema}
    command = [sys.executable, "-m", "conveyor.cli", "worker", "tests.apps.cli_app:app"]
    options = ["--lease", "1.5", "--poll-interval", "0.1", "--log-format", "json"]
    with log.open("w") as out:
        worker = subprocess.Popen(command + options, cwd=ROOT, env=env, stderr=out)
    try:
        assert app.enqueue("add", {"a": 1, "b": 2}).result(timeout=30) == 3
        proxy.refuse()
        time.sleep(DOWN_SECONDS)
        proxy.restore()
        assert app.enqueue("add", {"a": 2, "b": 2}).result(timeout=60) == 4
        # Every part reconnects with its own back-off (the heartbeat's pool may
        # still be waiting out its own): the end of the outage is said once all are.
        deadline = time.monotonic() + 60
        while "reachable again" not in log.read_text():
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=60) == 0
    finally:
        if worker.poll() is None:
            worker.kill()
        app.close()
    found = records(log)
    ours = [r for r in found if r["logger"].startswith("conveyor")]
    down = [r for r in ours if "unreachable" in r["message"]]
    back = [r for r in ours if "reachable again" in r["message"]]
    warnings = [r for r in ours if r["level"] == "WARNING"]
    assert down, "the outage was not logged"
    assert down[0]["message"].startswith("store unreachable (")
    assert "connect" in " ".join(r["message"] for r in down)  # the cause is named
    calls = [int(r["message"].split("(")[1].split()[0]) for r in back]
    # One outage, said to end once. A pooled connection the reset closed
    # may fail one call just after (the pool does not test a connection it
    # hands out): a blip of its own, said as such.
    [outage] = [n for n in calls if n > 2]
    assert outage >= 10, "the outage did not cost the worker many calls"
    assert len(calls) <= 3, calls
    assert len(warnings) <= 6 + 2 * (len(calls) - 1), [r["message"] for r in warnings]
    # The driver's lines come through conveyor's handler: JSON, bounded.
    driver = [r for r in found if r["logger"].startswith("psycopg")]
    assert all({"time", "level", "message"} <= r.keys() for r in driver)
    assert len(driver) <= 10, [r["message"] for r in driver]
