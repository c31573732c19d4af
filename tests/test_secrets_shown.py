"""A store's password, given every way the drivers take it, is never shown:
not by a command's output or error, a worker's log, the dashboard's start
line, pages or metrics. Run for real on PostgreSQL (trust authentication
takes any password) and Redis (which takes one without ``requirepass``):
the commands in this process (click's runner), the worker and the
dashboard's server in processes of their own."""

from __future__ import annotations

import html
import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import quote

import pytest
from click.testing import CliRunner, Result
from starlette.testclient import TestClient

import conveyor
from conveyor.cli import main
from conveyor.dashboard import create_app
from tests.cli_harness import ROOT, Cli
from tests.conftest import PG_URL, REDIS_URL, drop_redis_prefix, drop_schema, new_schema_name
from tests.test_cli import APP
from tools.redis_server import free_port

SECRET = "Sekr3tW0rd"
ENCODED = quote(f"{SECRET}@:/?#&", safe="")
"""The secret with every character a URL gives a meaning to, percent-encoded."""


def _userinfo(url: str, userinfo: str) -> str:
    return url.replace("://", f"://{userinfo}@", 1)


def _query(url: str, query: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}{query}"


REACHABLE = {
    "postgres-userinfo": _userinfo(PG_URL, f"root:{ENCODED}"),
    "postgres-query": _query(PG_URL, f"password={SECRET}&sslpassword={ENCODED}"),
    "redis-userinfo": _userinfo(REDIS_URL, f":{ENCODED}"),
    "redis-user": _userinfo(REDIS_URL, f"default:{SECRET}"),
    "redis-query": _query(REDIS_URL, f"password={SECRET}"),
}

REFUSED = {
    "postgres-down": f"postgresql://root:{SECRET}@127.0.0.1:1/test?connect_timeout=2",
    "postgres-down-query": f"postgresql://root@127.0.0.1:1/test?password={SECRET}",
    "redis-down": f"redis://:{SECRET}@127.0.0.1:1/0",
    "psycopg-scheme": f"postgresql+psycopg://root:{SECRET}@127.0.0.1/test",
    "sentinel-scheme": f"redis+sentinel://:{SECRET}@127.0.0.1:26379/m",
    "unix-socket": f"unix://:{SECRET}@/run/redis.sock?db=0",
    "libpq-keywords": f"host=127.0.0.1 dbname=test password={SECRET}",
    "bad-percent": f"postgresql://root:pa%zz{SECRET}@127.0.0.1/test",
    "bad-query": f"postgresql://root@127.0.0.1/test?password{SECRET}",
    "bad-ipv6": f"postgresql://root:{SECRET}@[::1/test",
}


def _conveyor(url: str, schema: str, *args: str) -> Result:
    """Run a ``conveyor`` command here; fail the test if it shows the secret."""
    env = {"CONVEYOR_URL": url, "CONVEYOR_SCHEMA": schema}
    done = CliRunner().invoke(main, list(args), env=env)
    said = f"{done.output}{done.exception or ''}"
    assert SECRET not in said, f"{args}: {said!r}"
    return done


def _in_processes(url: str, schema: str) -> tuple[subprocess.CompletedProcess[str], str]:
    """A worker's burst, and the first line ``conveyor dashboard`` prints
    (its start line or its error), each in a process of its own, at once."""
    cli = Cli(url, schema)
    command = ["dashboard", "--port", str(free_port()), "--token", "t"]
    server = subprocess.Popen(
        [sys.executable, "-m", "conveyor.cli", *command],
        cwd=ROOT,
        env=cli.env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        worker = cli.run("worker", APP, "--burst", "--poll-interval", "0.05")
        assert server.stderr is not None
        start = server.stderr.readline()
    finally:
        server.terminate()
        server.wait(timeout=30)
        if server.stderr is not None:
            server.stderr.close()
    for said in (worker.stdout, worker.stderr, start):
        assert SECRET not in said
    return worker, start


@pytest.fixture(params=sorted(REACHABLE))
def store(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    """A secret-bearing URL of a reachable store, and a fresh schema or
    prefix on it (dropped after)."""
    url, schema = REACHABLE[request.param], new_schema_name()
    yield url, schema
    if url.startswith("redis"):
        drop_redis_prefix(schema)
    else:
        drop_schema(schema)


def test_no_command_or_log_line_shows_the_stores_password(
    store: tuple[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    url, schema = store
    assert _conveyor(url, schema, "migrate").exit_code == 0
    task_id = _conveyor(url, schema, "enqueue", "add", "--args", '{"a": 1, "b": 2}', "--json")
    task = json.loads(task_id.stdout)["id"]
    worker, start = _in_processes(url, schema)
    assert worker.returncode == 0, worker.stderr
    assert "127.0.0.1" in worker.stderr.splitlines()[0]  # the worker's first line names it
    assert start.startswith("dashboard of ") and "127.0.0.1" in start
    for args in [
        ("health", "--min-workers", "0"),
        ("health", "--min-workers", "0", "--json"),
        ("tasks",),
        ("counts",),
        ("show", str(task)),
        ("explain", str(task)),
        ("workers",),
        ("top", "--once"),
        ("tasks", "--url", url),
    ]:
        done = _conveyor(url, schema, *args)
        assert done.exit_code == 0, (args, done.output)
    assert "127.0.0.1" in _conveyor(url, schema, "health", "--min-workers", "0").output
    missing = _conveyor(url, f"{schema}_missing", "tasks")  # refused: no store there
    assert missing.exit_code == 2 and "127.0.0.1" in missing.output
    assert SECRET not in caplog.text


def test_no_dashboard_page_shows_the_stores_password(store: tuple[str, str]) -> None:
    url, schema = store
    with conveyor.App(url, schema=schema, allow_unregistered=True) as app:
        app.migrate()
        task_id = app.enqueue("add", {"a": 1, "b": 2}).id
        with TestClient(create_app(app, allowed_hosts=["testserver"])) as client:
            for path in (
                "/",
                "/queues",
                "/tasks",
                f"/tasks/{task_id}",
                "/failed",
                "/workers",
                "/schedules",
                "/metrics",
            ):
                page = client.get(path)
                assert page.status_code == 200, path
                assert SECRET not in page.text, path
            header = html.escape(app.location, quote=False)
            assert header in client.get("/").text  # the header names the store
        assert SECRET not in app.location


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_store_refused_or_unreachable_is_named_without_its_password(
    name: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    url, schema = REFUSED[name], new_schema_name()
    for args in [
        ("tasks",),
        ("health",),
        ("migrate",),
        ("dashboard", "--no-auth"),
        ("counts", "--url", url),
    ]:
        assert _conveyor(url, schema, *args).exit_code != 0, args
    with pytest.raises(conveyor.ConveyorError) as refused, conveyor.App(url) as app:
        app.count_tasks()
    assert SECRET not in str(refused.value)


def test_a_worker_refused_its_store_does_not_show_the_password() -> None:
    # A worker opens its store as `conveyor migrate` does, run above: here
    # one store that does not answer, one URL libpq refuses, one scheme
    # conveyor does not know.
    names = ["postgres-down-query", "bad-percent", "sentinel-scheme"]
    with ThreadPoolExecutor(max_workers=len(names)) as pool:
        runs = list(
            pool.map(
                lambda name: Cli(REFUSED[name], "conveyor").run("worker", APP, "--burst"), names
            )
        )
    for done in runs:
        assert done.returncode != 0, done.args
        assert SECRET not in done.stdout + done.stderr, done.stderr
