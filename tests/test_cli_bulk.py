"""The CLI's bulk commands by filter (``retry``, ``cancel``, ``delete``) read
their filter in the same write as their action, on every store a command
can reach: a task whose state changes after the command starts is judged
as it is at the write.

The race is made deterministic in process: the change runs once, at the
first of the command's listing (what a command that lists then acts per id
did) or its bulk write (what it does now), so on any version the change
falls between the command's start and its action."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import conveyor
from conveyor.backends.protocol import Backend
from conveyor.cli import main
from conveyor.controls import Controls
from conveyor.model import TaskState
from tests.conformance.test_controls import fail_all
from tests.conformance.test_tasks import claim, enqueue, new
from tests.conftest import backend_url, drop_redis_prefix, schema_for


class Store:
    def __init__(self, app: conveyor.App, env: dict[str, str]) -> None:
        self.app, self.env = app, env

    def run(self, coroutine: Any) -> Any:
        return self.app.portal.run(coroutine)

    def backend(self) -> Backend:
        backend: Backend = self.run(self.app.backend())
        return backend

    def state(self, task_id: int) -> TaskState | None:
        task = self.app.get(task_id)
        return None if task is None else task.state

    def cli(self, *args: str) -> str:
        done = CliRunner().invoke(main, list(args), env=self.env, catch_exceptions=False)
        assert done.exit_code == 0, done.output
        return done.output


@pytest.fixture(params=["postgres", "sqlite", "redis"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    url, options = backend_url(request.param, schema_for(request.param, request), tmp_path)
    app = conveyor.App(url, **options)
    app.migrate()
    env = {"CONVEYOR_URL": url}
    if "schema" in options:
        env["CONVEYOR_SCHEMA"] = options["schema"]
    yield Store(app, env)
    app.close()
    if request.param == "redis":
        drop_redis_prefix(options["schema"])


def race_once(monkeypatch: pytest.MonkeyPatch, change: Callable[[], None], bulk: str) -> None:
    """Run ``change`` once: after the command's first listing, or before its
    first bulk write (``bulk``, a method of the app), whichever comes first."""
    done: list[bool] = []

    def once() -> None:
        if not done:
            done.append(True)
            change()

    listing = conveyor.App.list_tasks
    acting = getattr(Controls, bulk, None)  # a version without it only lists

    def listed(self: conveyor.App, *args: Any, **kwargs: Any) -> Any:
        page = listing(self, *args, **kwargs)
        once()
        return page

    def acted(self: conveyor.App, *args: Any, **kwargs: Any) -> Any:
        once()
        assert acting is not None
        return acting(self, *args, **kwargs)

    monkeypatch.setattr(conveyor.App, "list_tasks", listed)
    if acting is not None:
        monkeypatch.setattr(conveyor.App, bulk, acted)


def test_retry_of_failed_tasks_leaves_one_cancelled_meanwhile(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = store.run(enqueue(store.backend(), new(), new(), new()))
    store.run(fail_all(store.backend()))

    def retried_and_cancelled() -> None:
        store.app.retry(ids[1])
        store.app.cancel(ids[1])

    race_once(monkeypatch, retried_and_cancelled, "retry_many")
    store.cli("retry", "--state", "failed", "--name", "job")
    assert [store.state(i) for i in ids] == [
        TaskState.PENDING,
        TaskState.CANCELLED,
        TaskState.PENDING,
    ]


def test_cancel_of_pending_tasks_leaves_one_started_meanwhile(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = store.run(enqueue(store.backend(), new(), new()))
    race_once(monkeypatch, lambda: store.run(claim(store.backend(), limit=1)), "cancel_many")
    store.cli("cancel", "--state", "pending", "--name", "job")
    started = store.app.get(ids[0])
    assert started is not None and started.state is TaskState.IN_PROGRESS
    assert not started.cancel_requested
    assert store.state(ids[1]) is TaskState.CANCELLED


def test_delete_of_failed_tasks_leaves_one_retried_meanwhile(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = store.run(enqueue(store.backend(), new(), new(), new("other")))
    store.run(fail_all(store.backend(), names=("job", "other")))
    race_once(monkeypatch, lambda: store.app.retry(ids[0]), "delete_many")
    assert store.cli("delete", "--state", "failed", "--name", "job", "--yes").strip() == (
        "deleted 1 task(s)"
    )
    assert [store.state(i) for i in ids] == [TaskState.PENDING, None, TaskState.FAILED]
