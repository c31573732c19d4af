"""Unique tasks through the App, on every backend: a task's own Unique, a
call's, the key from a function or from the payload, conflicts, and four
processes racing to enqueue the same keys."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

import conveyor
from conveyor import TaskState, Unique
from conveyor.backends.protocol import Capability
from conveyor.errors import ConfigurationError, TaskExistsError
from tests.conftest import backend_url, drop_redis_prefix, schema_for
from tests.test_idempotency import own_connection

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def app(any_app: conveyor.App) -> conveyor.App:
    return any_app


def test_a_task_s_own_unique_key_from_its_arguments(app: conveyor.App) -> None:
    @app.task(unique=Unique(key=lambda args: f"report:{args['user']}"))
    def report(user: int, detail: str = "") -> None:
        return None

    first = report.enqueue(user=1, detail="a")
    assert report.enqueue(user=1, detail="b").id == first.id
    assert report.enqueue(user=2).id != first.id
    task = app.get(first.id)
    assert task is not None and task.idempotency_key == "report:1"
    # A call's own options win: a stored idempotency key, or another Unique.
    assert report.options(idempotency_key="once").enqueue(user=1).id != first.id
    forced = report.options(unique=Unique(key="x", on_conflict="raise"))
    held = forced.enqueue(user=1)
    with pytest.raises(TaskExistsError) as raised:
        forced.enqueue(user=3)
    assert raised.value.task_id == held.id


def test_the_payload_itself_is_the_key_by_default(app: conveyor.App) -> None:
    @app.task(unique=Unique())
    def sync(account: int, full: bool = False) -> None:
        return None

    a = app.enqueue(sync, {"account": 1, "full": True})
    assert app.enqueue(sync, {"full": True, "account": 1}).id == a.id  # key order is not data
    assert app.enqueue(sync, {"account": 1}).id != a.id
    handles = app.enqueue_many(sync, [{"account": 5}, {"account": 5}, {"account": 6}])
    assert handles[0].id == handles[1].id != handles[2].id


def test_replace_moves_a_pending_duplicate(app: conveyor.App) -> None:
    @app.task(unique=Unique(key="digest", scope="pending", on_conflict="replace"))
    def digest(items: list[int]) -> None:
        return None

    first = digest.options(delay=3600).enqueue(items=[1])
    again = digest.options(delay=60).enqueue(items=[1, 2])
    assert again.id == first.id
    task = app.get(first.id)
    assert task is not None and task.payload == {"items": [1, 2]}
    assert task.state is TaskState.PENDING
    assert task.run_at - task.created_at < timedelta(seconds=120)


def test_a_raise_inside_the_caller_s_transaction_leaves_it_usable(app: conveyor.App) -> None:
    @app.task(unique=Unique(key="only", on_conflict="raise"))
    def job(n: int) -> None:
        return None

    @app.task()
    def other() -> None:
        return None

    if Capability.TRANSACTIONAL_ENQUEUE not in app.make_backend().capabilities:
        pytest.skip("no transactional enqueue on this backend")
    app.migrate()
    held = job.enqueue(n=0)
    with own_connection(app) as conn:
        kept = app.enqueue(other, connection=conn)
        with pytest.raises(TaskExistsError):
            app.enqueue_many(job, [{"n": 1}], connection=conn)
        conn.commit()  # the caller's own work before the conflict commits
    assert app.get(kept.id) is not None
    assert [t.id for t in app.list_tasks(name="job")] == [held.id]


@pytest.mark.parametrize(
    "bad",
    [
        {"scope": "forever"},
        {"scope": -1},
        {"on_conflict": "merge"},
        {"key": ""},
        {"key": 42},
    ],
)
def test_a_bad_unique_is_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ConfigurationError, match=r"Unique|idempotency key"):
        Unique(**bad)  # type: ignore[arg-type]


def test_a_key_function_that_fails_is_a_configuration_error(app: conveyor.App) -> None:
    @app.task(unique=Unique(key=lambda args: args["missing"]))
    def job(n: int) -> None:
        return None

    with pytest.raises(ConfigurationError, match="unique key function"):
        job.enqueue(n=1)
    with pytest.raises(ConfigurationError, match="idempotency_key or unique"):
        job.options(idempotency_key="a", unique=Unique(key="b"))


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["postgres", "sqlite", "redis"])
def test_four_processes_racing_store_one_task_per_key(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    url, options = backend_url(kind, schema_for(kind, request), tmp_path)
    schema = options.get("schema")
    env = {**os.environ, "CONVEYOR_URL": url, "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}"}
    if schema:
        env["CONVEYOR_SCHEMA"] = schema
    migrating = conveyor.App(url, schema=schema)
    migrating.migrate()
    migrating.close()
    racers = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.apps.unique_race", "60", str(me)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for me in range(4)
    ]
    answers = []
    for racer in racers:
        out, err = racer.communicate(timeout=120)
        assert racer.returncode == 0, err
        answers.append(json.loads(out))
    # Every process got the same task for each key, and one task per key exists.
    assert all(answer == answers[0] for answer in answers)
    app = conveyor.App(url, schema=schema)
    try:
        tasks = app.list_tasks(limit=1000)
    finally:
        app.close()
        if kind == "redis" and schema:
            drop_redis_prefix(schema)
    assert len(tasks) == 60
    assert sorted(t.idempotency_key or "" for t in tasks) == sorted(f"user:{u}" for u in range(60))
