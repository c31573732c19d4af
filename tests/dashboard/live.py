"""What the browser suites share: a headless system Chromium, a seeded
PostgreSQL store of its own, and a dashboard served by uvicorn in a thread."""

from __future__ import annotations

import shutil
import socket
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest

import conveyor
from tests.conftest import PG_URL
from tests.dashboard.seed import Seeded, seed_app

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium: apt-get install chromium"
)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextmanager
def serving(web: Any) -> Iterator[str]:
    """``web`` served by uvicorn in a thread on 127.0.0.1; its base URL."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(web, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.started, "the server did not start"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@contextmanager
def seeded_store() -> Iterator[tuple[conveyor.App, Seeded]]:
    """An App on a fresh PostgreSQL schema, seeded; the schema dropped after."""
    schema = f"t_{uuid.uuid4().hex[:12]}"
    app = conveyor.App(PG_URL, schema=schema)
    app.migrate()
    seeded = app.portal.run(seed_app(app))
    try:
        yield app, seeded
    finally:
        app.close()
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(
                psycopg.sql.SQL("drop schema if exists {} cascade").format(
                    psycopg.sql.Identifier(schema)
                )
            )


@contextmanager
def chromium(args: Sequence[str] = ()) -> Iterator[Any]:
    """A headless system Chromium driven by Playwright."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=list(args)
        )
        try:
            yield launched
        finally:
            launched.close()
