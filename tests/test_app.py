"""The App as a client on PostgreSQL, across processes and event loops: its
sync API works in a forked child, and its async API leaves no pool open
behind an event loop that has ended."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
import warnings
from pathlib import Path

import conveyor

ROOT = Path(__file__).resolve().parents[1]

# The sync API's portal was once not fork-safe: after os.fork()
# (multiprocessing's default start method on Linux, gunicorn --preload...)
# the child saw a started portal whose loop thread did not exist, and every
# sync call blocked forever (and would have shared the parent's pooled
# sockets had it run).


def test_sync_api_works_in_a_forked_child(app: conveyor.App) -> None:
    @app.task()
    def noop() -> None:
        return None

    app.enqueue(noop)  # the parent uses the sync API: portal thread and pool started
    with warnings.catch_warnings():  # 3.12+: "multi-threaded process ... fork()"
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child
        try:
            signal.signal(signal.SIGALRM, signal.SIG_DFL)
            signal.alarm(2)  # a hang ends the child here
            app.enqueue(noop)
        except BaseException:
            os._exit(1)
        os._exit(0)
    deadline = time.monotonic() + 6
    status = None
    while time.monotonic() < deadline:
        done, code = os.waitpid(pid, os.WNOHANG)
        if done:
            status = code
            break
        time.sleep(0.05)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    assert status is not None
    assert not os.WIFSIGNALED(status), "the child's app.enqueue hung (killed by its alarm)"
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


# The async API once opened one connection pool per event loop and never
# closed it: every asyncio.run() that touched the App leaked a pooled
# connection (scripts, CLIs, per-test loops) until PostgreSQL's
# max_connections.

_LEAK_SCRIPT = """
import asyncio, sys
import conveyor

app = conveyor.App(sys.argv[1], schema=sys.argv[2])

@app.task()
async def noop() -> None:
    return None

for _ in range(3):
    asyncio.run(noop.enqueue_async())  # each run: a fresh loop, a fresh pool

import psycopg
with psycopg.connect(sys.argv[1].split("?")[0]) as conn:
    count = conn.execute(
        "select count(*) from pg_stat_activity where application_name = %s",
        (sys.argv[3],)).fetchone()[0]
print(count)
"""


def test_async_api_does_not_leak_a_pool_per_event_loop(pg_url: str, schema: str) -> None:
    name = f"leak-{uuid.uuid4().hex[:8]}"
    url = f"{pg_url}?application_name={name}"
    out = subprocess.run(
        [sys.executable, "-c", _LEAK_SCRIPT, url, schema, name],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    open_connections = int(out.stdout.strip().splitlines()[-1])
    assert open_connections == 0, f"{open_connections} pooled connections left open by 3 runs"
