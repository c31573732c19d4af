"""The dashboard in a real browser (Playwright driving a headless system
Chromium) against PostgreSQL: every page loads, the buttons change the
store, and a full-page screenshot of each page is saved (to
``$CONVEYOR_SCREENSHOTS`` if set, else the test's temporary directory)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import conveyor
from conveyor.dashboard import create_app, token_auth
from conveyor.model import TaskState
from tests.dashboard.live import chromium, needs_chromium, seeded_store, serving
from tests.dashboard.seed import Seeded

pytestmark = needs_chromium
TOKEN = "browser-token"


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[conveyor.App, Seeded, str]]:
    """A seeded PostgreSQL store and its dashboard served by uvicorn in a thread."""
    with seeded_store() as (app, seeded), serving(create_app(app, auth=token_auth(TOKEN))) as url:
        yield app, seeded, url


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as launched:
        yield launched


@pytest.fixture
def page(browser: Any, served: tuple[conveyor.App, Seeded, str]) -> Iterator[Any]:
    """A signed-in page (the first visit carries the token, then its cookie)."""
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    tab = context.new_page()
    tab.goto(f"{served[2]}/?token={TOKEN}")
    yield tab
    context.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    chosen = os.environ.get("CONVEYOR_SCREENSHOTS")
    where = Path(chosen) if chosen else tmp_path_factory.mktemp("screenshots")
    where.mkdir(parents=True, exist_ok=True)
    return where


def test_every_page_loads_and_is_captured(
    page: Any, served: tuple[conveyor.App, Seeded, str], shots: Path
) -> None:
    _, s, base = served
    visits = {
        "overview": ("/", "Tasks by queue and state"),
        "queues": ("/queues", "due now"),
        "tasks": ("/tasks", "Filter"),
        "tasks-failed": ("/tasks?state=failed", "failed"),
        "task-failed": (f"/tasks/{s.failed}", "Traceback (most recent call last)"),
        "task-running": (f"/tasks/{s.running}", "running"),
        "task-step": (f"/tasks/{s.step}", "charge"),
        "task-inbox": (f"/tasks/{s.chat}", "unread message"),
        "task-big": (f"/tasks/{s.big}", "Shown: the first"),
        "failed": ("/failed", "Retry selected"),
        "workers": ("/workers", "w1"),
        "schedules": ("/schedules", "No schedule stored"),
        "not-found": ("/tasks/987654", "No task has id 987654"),
    }
    for name, (path, text) in visits.items():
        response = page.goto(base + path)
        assert response is not None
        assert response.status == (404 if name == "not-found" else 200), name
        assert text in page.content(), name
        page.screenshot(path=str(shots / f"{name}.png"), full_page=True)


def test_buttons_change_the_store(page: Any, served: tuple[conveyor.App, Seeded, str]) -> None:
    app, s, base = served
    page.goto(f"{base}/tasks/{s.failed}")
    page.get_by_role("button", name="Retry").click()
    page.wait_for_url(f"**/tasks/{s.failed}?notice=retried*")
    assert "pending again" in page.content()
    assert app.get(s.failed).state is TaskState.PENDING  # type: ignore[union-attr]

    page.goto(f"{base}/tasks/{s.pending}")
    page.get_by_role("button", name="Cancel").click()
    page.wait_for_url(f"**/tasks/{s.pending}?notice=*")
    assert app.get(s.pending).state is TaskState.CANCELLED  # type: ignore[union-attr]

    page.goto(f"{base}/queues")
    page.locator("tr", has_text="mail").get_by_role("button", name="Pause").click()
    page.wait_for_url("**/queues?notice=paused*")
    assert [p.name for p in app.pauses()] == ["mail"]
    page.locator("tr", has_text="mail").get_by_role("button", name="Resume").click()
    page.wait_for_url("**/queues?notice=resumed*")
    assert app.pauses() == []

    page.goto(f"{base}/failed")
    page.get_by_label(f"select task {s.failed_more[0]}").check()
    page.get_by_role("button", name="Retry selected").click()
    page.wait_for_url("**/failed?notice=retried_many*")
    assert app.get(s.failed_more[0]).state is TaskState.PENDING  # type: ignore[union-attr]
    assert app.get(s.failed_more[1]).state is TaskState.FAILED  # type: ignore[union-attr]


def test_refusals(browser: Any, served: tuple[conveyor.App, Seeded, str]) -> None:
    app, s, base = served
    context = browser.new_context()
    try:
        signed_out = context.request.get(f"{base}/")
        assert signed_out.status == 401
        headers = {"Authorization": f"Bearer {TOKEN}"}
        forged = context.request.post(
            f"{base}/tasks/{s.failed_more[1]}/retry", headers=headers, form={"csrf_token": "x"}
        )
        assert forged.status == 403
        assert app.get(s.failed_more[1]).state is TaskState.FAILED  # type: ignore[union-attr]
    finally:
        context.close()


def test_a_task_graph_is_drawn_linked_and_acted_on(
    page: Any, served: tuple[conveyor.App, Seeded, str], shots: Path
) -> None:
    app, _, base = served

    @app.task(name="graph_job")
    def graph_job() -> None:
        return None

    members = [graph_job.enqueue().id for _ in range(2)]
    callback = graph_job.options(after=members).enqueue().id
    page.goto(f"{base}/tasks/{members[0]}")
    page.get_by_role("link", name="The graph of its dependencies").click()
    page.wait_for_url(f"**/tasks/{members[0]}/graph")
    boxes = page.locator("svg.graph a")
    assert boxes.count() == 3 and page.locator("svg.graph line").count() == 2
    assert page.locator("svg.graph").bounding_box()["width"] > 300
    page.screenshot(path=str(shots / "task-graph.png"), full_page=True)
    page.locator(f'svg.graph a[href$="/tasks/{callback}"]').click()
    page.wait_for_url(f"**/tasks/{callback}")
    page.goto(f"{base}/tasks/{callback}/graph")
    page.get_by_role("button", name="Cancel not ended (3)").click()
    page.wait_for_url(f"**/tasks/{callback}/graph?notice=graph_cancelled*")
    assert "of the graph are cancelled" in page.content()
    for task_id in (*members, callback):
        assert app.get(task_id).state is TaskState.CANCELLED  # type: ignore[union-attr]
