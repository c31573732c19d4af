"""Least privilege on PostgreSQL: the roles and grants of docs/operations.md,
run as they are printed there, then a worker, a producer, and the read
commands and the dashboard, each as its own role; and a store that is not
there is refused, never created."""

from __future__ import annotations

import http.cookiejar
import re
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

import conveyor
from tests.apps import least_privilege as lp
from tests.cli_harness import ROOT, Cli
from tests.conftest import PG_URL
from tools.redis_server import free_port

DOC = ROOT / "docs" / "operations.md"
ROLES = ("migrator", "worker", "producer", "reader")
SETTLE_BOUND = 60.0
CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


def sql_blocks() -> list[str]:
    """The SQL blocks of the grants section of docs/operations.md, in order."""
    text = DOC.read_text()
    section = text[text.index("## Roles and grants on PostgreSQL") :]
    return re.findall(r"```sql\n(.*?)```", section, re.S)


def as_role(url: str, role: str) -> str:
    """``url`` connecting as ``role`` (the test server trusts local roles)."""
    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    port = f":{parts.port}" if parts.port else ""
    return urlunsplit((parts.scheme, f"{role}@{host}{port}", parts.path, parts.query, ""))


@dataclass
class Store:
    schema: str
    roles: dict[str, str]
    """Each kind of role (``ROLES``) to its name for this test."""

    def url(self, kind: str) -> str:
        return as_role(PG_URL, self.roles[kind])

    def cli(self, kind: str) -> Cli:
        return Cli(self.url(kind), self.schema)


def _named(statements: str, schema: str, roles: dict[str, str]) -> str:
    for kind, name in roles.items():
        statements = re.sub(rf"\bconveyor_{kind}\b", name, statements)
    return re.sub(r"\bconveyor\b", schema, statements)


@pytest.fixture
def store(schema: str) -> Iterator[Store]:
    """A schema made and migrated as docs/operations.md says: the roles and
    the schema by the administrator, the tables by ``conveyor migrate`` as
    the migrating role (no CREATE on the database), the grants by it too."""
    tag = uuid.uuid4().hex[:8]
    roles = {kind: f"cv_{kind}_{tag}" for kind in ROLES}
    admin, grants = sql_blocks()
    made = Store(schema, roles)
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(_named(admin, schema, roles).encode())
    try:
        migrated = made.cli("migrator").run("migrate")
        assert migrated.returncode == 0, migrated.stderr
        with psycopg.connect(made.url("migrator"), autocommit=True) as conn:
            conn.execute(_named(grants, schema, roles).encode())
        yield made
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(
                psycopg.sql.SQL("drop schema if exists {} cascade").format(
                    psycopg.sql.Identifier(schema)
                )
            )
            for name in reversed(roles.values()):
                conn.execute(
                    psycopg.sql.SQL("drop owned by {name}; drop role {name}").format(
                        name=psycopg.sql.Identifier(name)
                    )
                )


def _status(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read().decode()


def _settled(app: conveyor.App, ids: list[int]) -> dict[int, conveyor.Task]:
    deadline = time.monotonic() + SETTLE_BOUND
    while True:
        found = {i: app.get(i) for i in ids}
        if all(t is not None and t.state == conveyor.TaskState.SUCCEEDED for t in found.values()):
            return {i: t for i, t in found.items() if t is not None}
        assert time.monotonic() < deadline, {i: t and t.state for i, t in found.items()}
        time.sleep(0.2)


def test_each_role_runs_with_the_documented_grants_alone(store: Store) -> None:
    command = ["worker", "tests.apps.least_privilege:app", "--no-migrate", "--lease", "2"]
    worker = subprocess.Popen(
        [sys.executable, "-m", "conveyor.cli", *command, "--log-level", "WARNING"],
        cwd=ROOT,
        env=store.cli("worker").env,
        stderr=subprocess.PIPE,
        text=True,
    )
    # An App left to migrate, on a current store: it reads, and needs no DDL right.
    watcher = conveyor.App(store.url("reader"), schema=store.schema)
    try:
        # The producer: plain, batched, keyed, unique, keyed by concurrency,
        # a coroutine, and in its own transaction.
        lp.app.use(store.url("producer"), schema=store.schema)
        ids = [lp.add.enqueue(1, 2).id]
        ids += [h.id for h in lp.app.enqueue_many(lp.add, [{"a": i, "b": i} for i in range(3)])]
        ids.append(lp.add.options(idempotency_key="once").enqueue(3, 4).id)
        again = lp.add.options(idempotency_key="once").enqueue(3, 4).id
        assert again == ids[-1]
        ids.append(lp.add.options(unique=conveyor.Unique(key="u")).enqueue(5, 6).id)
        ids += [lp.keyed.enqueue(key="k").id for _ in range(2)]
        outlive = lp.outlive.enqueue(4.0).id
        ids.append(outlive)
        parent = lp.parent.start({})
        ids.append(parent.id)
        with psycopg.connect(store.url("producer")) as conn:
            ids.append(lp.add.options(connection=conn).enqueue(7, 8).id)
        ids.append(store.cli("producer").enqueue("add", {"a": 0, "b": 0}))
        # The worker ran them all, the one that outlives its lease included.
        done = _settled(watcher, ids)
        assert done[ids[0]].result == 3
        assert done[parent.id].result == 5  # its child's end message reached it
        outlived = done[outlive]
        assert outlived.result == "kept" and len(outlived.attempts) == 1
        deadline = time.monotonic() + SETTLE_BOUND
        while not watcher.list_tasks(name="tick", state="succeeded"):
            assert time.monotonic() < deadline, "the schedule never fired"
            time.sleep(0.2)
        # The reader: every read command, and the dashboard's pages.
        reader = store.cli("reader")
        listed = reader.ok("tasks", "--json")
        assert str(ids[0]) in listed
        assert reader.show(ids[0])["state"] == "succeeded"
        for command in (
            ("counts",),
            ("workers",),
            ("explain", str(ids[0])),
            ("top", "--once"),
            ("schedules",),
            ("pauses",),
            ("keys",),
            ("prune", "--dry-run"),
            ("retry", "--state", "failed", "--dry-run"),
            ("migrate", "--sql"),
            ("health", "--min-workers", "1"),
        ):
            reader.ok(*command)
        _dashboard_pages(reader, ids[0])
        refused = reader.run("cancel", str(ids[0]))
        assert refused.returncode == 1 and "permission denied" in refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1
    finally:
        lp.app.close()
        watcher.close()
        worker.terminate()
        _, err = worker.communicate(timeout=60)
    assert "permission denied" not in err, err[-3000:]
    assert worker.returncode == 0, err[-3000:]


def _dashboard_pages(reader: Cli, task_id: int) -> None:
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "conveyor.cli", "dashboard", "--port", str(port), "--no-auth"],
        cwd=ROOT,
        env=reader.env,
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                status, _ = _status(f"{base}/")
                break
            except OSError:
                assert time.monotonic() < deadline and server.poll() is None, "never listened"
                time.sleep(0.1)
        assert status == 200
        for page in ("queues", "tasks", f"tasks/{task_id}", "failed", "workers", "schedules"):
            status, text = _status(f"{base}/{page}")
            assert status == 200, (page, text[-2000:])
        status, metrics = _status(f"{base}/metrics")
        assert status == 200 and "conveyor_" in metrics
        # An action the role may not take fails with a page that says why.
        browser = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar())
        )
        with browser.open(f"{base}/queues", timeout=10) as page:
            token = CSRF.search(page.read().decode())
        assert token is not None
        form = urllib.parse.urlencode({"csrf_token": token.group(1), "queue": "default"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            browser.open(f"{base}/queues/pause", data=form.encode(), timeout=10)
        assert refused.value.code == 500
        assert "permission denied for table pauses" in refused.value.read().decode()
    except BaseException:
        server.terminate()
        print(server.communicate(timeout=30)[1][-3000:])
        raise
    server.terminate()
    server.communicate(timeout=30)


def test_the_worker_holds_a_grant_on_every_table_a_migration_makes(store: Store) -> None:
    """A table a migration adds and the grants forget fails a worker only
    when its path reaches it (a prune, a dependency): this names it at once."""
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        tables = [
            row[0]
            for row in conn.execute(
                "select tablename from pg_tables where schemaname = %s", (store.schema,)
            )
        ]
        missing = [
            (table, right)
            for table in tables
            if table not in ("pauses", "migrations")  # the worker reads them only
            for right in ("select", "insert", "update", "delete")
            if not conn.execute(
                "select has_table_privilege(%s, %s, %s)",
                (store.roles["worker"], f'"{store.schema}"."{table}"', right),
            ).fetchone()[0]
        ]
    assert tables and missing == []
