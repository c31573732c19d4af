"""The dashboard's defences in a real browser (Playwright driving a headless
system Chromium) against PostgreSQL: a page on another port of the same
host can neither act for a signed-in operator nor frame a page; no page
breaks its own Content-Security-Policy; a rebound host name is refused."""

from __future__ import annotations

import html
import re
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from starlette.requests import Request

import conveyor
from conveyor.dashboard import Auth, basic_auth, create_app, token_auth
from conveyor.model import TaskState
from tests.dashboard.live import chromium, free_port, needs_chromium, seeded_store, serving
from tests.dashboard.seed import Seeded

pytestmark = needs_chromium
TOKEN = "browser-token"
SITE_SESSION = "site_session"
"""The cookie of the host application that the custom hook below trusts."""


@contextmanager
def attacker(page_for: Callable[[str], tuple[str, str]]) -> Iterator[str]:
    """A page server on another port of 127.0.0.1 (same site, other origin):
    ``page_for(path)`` is the HTML it answers for a path, and a cookie it
    sets (cookies are not isolated by port: it lands on the dashboard's host
    too, over a cookie of the same name, HttpOnly or not)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            page, cookie = page_for(self.path)
            body = page.encode()
            self.send_response(200)
            if cookie:
                self.send_header("set-cookie", f"{cookie}; Path=/; HttpOnly; SameSite=Lax")
            self.send_header("content-type", "text/html; charset=utf-8")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.fixture
def store() -> Iterator[tuple[conveyor.App, Seeded]]:
    with seeded_store() as pair:
        yield pair


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium(["--host-resolver-rules=MAP rebind.test 127.0.0.1"]) as launched:
        yield launched


def site_session_hook(request: Request) -> bool:
    """A host application's own hook: its session cookie says who is in."""
    return request.cookies.get(SITE_SESSION) == "operator-session"


def signed_in(browser: Any, kind: str, base: str) -> Any:
    """A browser context whose operator is signed in to the dashboard at ``base``."""
    if kind == "basic":
        context = browser.new_context(http_credentials={"username": "ops", "password": "pw"})
    else:
        context = browser.new_context()
    tab = context.new_page()
    if kind == "token":
        tab.goto(f"{base}/?token={TOKEN}")
    elif kind == "hook":
        context.add_cookies(
            [{"name": SITE_SESSION, "value": "operator-session", "url": base, "sameSite": "Lax"}]
        )
    response = tab.goto(f"{base}/failed")
    assert response is not None and response.status == 200, kind
    assert "Retry selected" in tab.content()
    return context


def forged_post(dashboard: str, action: str, field: str, cookie: str) -> str:
    """The attacker's page: it plants the cookie it could take (if any) for
    the whole host (its server's response set it too), and submits a form
    to the dashboard at once."""
    planted = f"document.cookie = {cookie!r} + '; path=/';" if cookie else ""
    return (
        "<!doctype html><html><body>"
        f'<form id="f" method="post" action="{html.escape(dashboard + action)}">'
        f'<input name="csrf_token" value="{html.escape(field)}">'
        '<input name="queue" value="work"></form>'
        f"<script>{planted} document.getElementById('f').submit();</script>"
        "</body></html>"
    )


def taken_pair(dashboard: str) -> tuple[str, str]:
    """What a page of another port can take from the dashboard without
    signing in: a cookie the 401 page sets, and the token it carries."""
    try:
        urllib.request.urlopen(f"{dashboard}/failed", timeout=5)
        return "", ""
    except urllib.error.HTTPError as refused:
        found = refused.headers.get("set-cookie") or ""
    pair = found.split(";")[0]
    if not pair:
        return "", ""
    value = pair.partition("=")[2]
    return pair, value.split(".")[0]


@pytest.mark.parametrize("kind", ["token", "basic", "hook"])
def test_a_page_on_another_port_cannot_act_for_the_signed_in_operator(
    browser: Any, store: tuple[conveyor.App, Seeded], kind: str
) -> None:
    app, s = store
    auth: Auth = {
        "token": token_auth(TOKEN),
        "basic": basic_auth("ops", "pw"),
        "hook": site_session_hook,
    }[kind]
    actions = {
        "delete": f"/tasks/{s.failed}/delete",
        "cancel": f"/tasks/{s.pending}/cancel",
        "pause": "/queues/pause",
        "retry-all": "/failed/retry-all",
        "retry": f"/tasks/{s.cancelled}/retry",
    }
    with serving(create_app(app, auth=auth)) as dashboard:

        def page_for(path: str) -> str:
            cookie, field = taken_pair(dashboard)
            return forged_post(dashboard, actions[path.strip("/")], field, cookie), cookie

        with attacker(page_for) as evil:
            context = signed_in(browser, kind, dashboard)
            try:
                tab = context.new_page()
                for name in actions:
                    with tab.expect_response(
                        lambda r: r.request.method == "POST" and r.url.startswith(dashboard)
                    ) as posted:
                        tab.goto(f"{evil}/{name}")
                    assert posted.value.status == 403, (kind, name, posted.value.status)
            finally:
                context.close()
    assert app.get(s.failed) is not None
    assert app.get(s.failed).state is TaskState.FAILED  # type: ignore[union-attr]
    assert app.get(s.pending).state is TaskState.PENDING  # type: ignore[union-attr]
    assert app.get(s.cancelled).state is TaskState.CANCELLED  # type: ignore[union-attr]
    assert app.pauses() == []
    assert len(app.list_tasks(state="failed")) == 3


def test_a_page_on_another_port_cannot_frame_the_dashboard(
    browser: Any, store: tuple[conveyor.App, Seeded]
) -> None:
    app, s = store
    with serving(create_app(app, auth=token_auth(TOKEN))) as dashboard:
        target = f"{dashboard}/tasks/{s.failed}"

        def page_for(path: str) -> tuple[str, str]:
            return f'<!doctype html><iframe src="{target}" width="800" height="600"></iframe>', ""

        with attacker(page_for) as evil:
            context = signed_in(browser, "token", dashboard)
            try:
                tab = context.new_page()
                with tab.expect_response(lambda r: r.url == target) as framed:
                    tab.goto(f"{evil}/frame")
                assert framed.value.status == 200  # the cookie went along: only the headers stop it
                tab.wait_for_timeout(500)
                frames = [f for f in tab.frames if f is not tab.main_frame]
                assert len(frames) == 1
                shown = frames[0].url
                try:
                    text = frames[0].content()
                except Exception:  # a blocked frame may not be readable at all
                    text = ""
                assert "Traceback" not in text and "Retry" not in text, shown
            finally:
                context.close()


def test_no_page_breaks_the_content_security_policy_and_select_all_works(
    browser: Any, store: tuple[conveyor.App, Seeded]
) -> None:
    app, s = store
    with serving(create_app(app, auth=token_auth(TOKEN))) as dashboard:
        context = signed_in(browser, "token", dashboard)
        try:
            tab = context.new_page()
            tab.add_init_script(
                "window.violations = [];"
                "document.addEventListener('securitypolicyviolation',"
                " e => window.violations.push(e.violatedDirective + ' ' + e.blockedURI));"
            )
            errors: list[str] = []
            tab.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            paths = [
                "/",
                "/queues",
                "/tasks",
                f"/tasks/{s.failed}",
                f"/tasks/{s.chat}",
                f"/tasks/{s.step}",
                "/failed",
                "/workers",
                "/schedules",
                "/tasks/987654",
            ]
            for path in paths:
                response = tab.goto(dashboard + path)
                assert response is not None
                assert "frame-ancestors 'none'" in response.headers["content-security-policy"]
                tab.wait_for_load_state("load")
                assert tab.evaluate("window.violations") == [], path
            assert not [e for e in errors if "Content Security Policy" in e], errors
            tab.goto(f"{dashboard}/failed")
            boxes = tab.locator("input[name=task]")
            assert boxes.count() == 3
            tab.get_by_label("select all").check()
            assert all(boxes.nth(i).is_checked() for i in range(3))
            tab.get_by_label("select all").uncheck()
            assert not any(boxes.nth(i).is_checked() for i in range(3))
            tab.get_by_label("select all").check()
            tab.get_by_role("button", name="Retry selected").click()
            tab.wait_for_url(re.compile(r".*/failed\?notice=retried_many.*"))
            assert "3 failed task(s) are pending again" in tab.content()
            assert tab.evaluate("window.violations") == []
        finally:
            context.close()
    assert app.list_tasks(state="failed") == []


def test_a_rebound_host_name_is_refused_by_a_dashboard_with_no_auth(
    browser: Any, store: tuple[conveyor.App, Seeded]
) -> None:
    app, s = store
    with serving(create_app(app)) as dashboard:
        port = dashboard.rsplit(":", 1)[1]
        context = browser.new_context()
        try:
            tab = context.new_page()
            rebound = tab.goto(f"http://rebind.test:{port}/tasks")
            assert rebound is not None and rebound.status == 400
            assert f"/tasks/{s.failed}" not in tab.content()
            assert "conveyor" not in (rebound.headers.get("set-cookie") or "")
            for name in ("127.0.0.1", "localhost"):
                local = tab.goto(f"http://{name}:{port}/tasks")
                assert local is not None and local.status == 200, name
                assert f"/tasks/{s.failed}" in tab.content()
        finally:
            context.close()
