"""The dashboard's lists read no payload: the memory a page takes is bounded
by what it shows, not by what its tasks carry (on memory, SQLite,
PostgreSQL and Redis)."""

from __future__ import annotations

import gc
import tracemalloc

import pytest
from starlette.testclient import TestClient

import conveyor
from conveyor.backends.params import ClaimParams, Completion, EnqueueParams, ErrorInfo, FinishParams
from conveyor.dashboard import create_app
from conveyor.model import Outcome, TaskState
from tests.dashboard.seed import Seeded, new

Store = tuple[conveyor.App, Seeded]
PAYLOAD_CHARS = 900_000
"""Each big task's payload: under the 1 MB cap."""
BIG_TASKS = 8
"""Big tasks of each kind: failed, running and pending (21.6 MB in all)."""


async def _seed_big(app: conveyor.App) -> None:
    backend = await app.backend()
    big = [new("heavy", "heavy", {"blob": "x" * PAYLOAD_CHARS}) for _ in range(3 * BIG_TASKS)]
    ids = await backend.enqueue(EnqueueParams(big))
    taken = await backend.claim(
        ClaimParams("w1", ["heavy"], ["heavy"], limit=2 * BIG_TASKS, lease=600)
    )
    error = ErrorInfo("MemoryError", "too big to show", "Traceback ...")
    failed = [
        Completion(c.token, Outcome.FAILED, TaskState.FAILED, error=error)
        for c in taken[:BIG_TASKS]
    ]
    assert len((await backend.finish(FinishParams("w1", failed))).applied) == BIG_TASKS
    assert len(ids) == 3 * BIG_TASKS  # the rest: 8 running, 8 pending


def _peak_of(client: TestClient, path: str) -> tuple[int, str]:
    """The most memory Python held at once while ``path`` was served (above
    what it held before), and the page."""
    gc.collect()
    tracemalloc.start()
    try:
        page = client.get(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert page.status_code == 200, page.text
    return peak, page.text


@pytest.mark.parametrize(
    ("path", "shows"),
    [
        ("/tasks", "heavy"),
        ("/tasks?state=pending&queue=heavy", "heavy"),
        ("/failed", "too big to show"),
        ("/workers", "w1"),
    ],
)
def test_a_list_page_reads_no_payload(store: Store, path: str, shows: str) -> None:
    """24 tasks of 900 KB each (8 failed, 8 running, 8 pending): the Tasks
    page read every listed payload, the Failed page every failed task again
    with its attempts, the Workers page up to 1,000 running tasks whole, to
    count them. Each page now holds less than one payload at its peak."""
    app, _ = store
    app.portal.run(_seed_big(app))
    with TestClient(create_app(app, allowed_hosts=["testserver"])) as client:
        client.get(path)  # templates compiled, connections opened
        peak, text = _peak_of(client, path)
    assert shows in text
    assert peak < PAYLOAD_CHARS, f"{path}: {peak:,} bytes at the peak"
