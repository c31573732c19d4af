"""The dashboard's defences, through HTTP (Starlette's TestClient) on a
SQLite store: CSRF tokens bound to who signed in, the same-origin check of
every POST, the Host allow-list, relative redirects, security headers,
bounded bodies, expiring login cookies, checked query text and notices."""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Mount
from starlette.testclient import TestClient

import conveyor
from conveyor.dashboard import basic_auth, create_app, token_auth
from conveyor.dashboard.guard import MOST_BODY
from conveyor.dashboard.hosts import checked_hosts
from conveyor.dashboard.security import COOKIE_LIFETIME, Signer
from conveyor.errors import ConfigurationError
from conveyor.model import TaskState
from tests.dashboard.conftest import CSRF, HOSTS
from tests.dashboard.seed import Seeded, seed_app

TOKEN = "s3cret"
BEARER = {"authorization": f"Bearer {TOKEN}"}
CSP = (
    "default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self'; "
    "form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[tuple[conveyor.App, Seeded]]:
    app = conveyor.App(f"sqlite:///{tmp_path / 'conveyor.db'}")
    app.migrate()
    seeded = app.portal.run(seed_app(app))
    yield app, seeded
    app.close()


Store = tuple[conveyor.App, Seeded]


def state_of(app: conveyor.App, task_id: int) -> TaskState | None:
    found = app.get(task_id)
    return None if found is None else found.state


def token_in(page: str) -> str:
    found = CSRF.search(page)
    assert found is not None, "the page has a form with a CSRF token"
    return found.group(1)


class TwoUsers:
    """A host application's own hook: the ``x-user`` header names the user,
    and ``identity`` says which one signed in."""

    def __call__(self, request: Request) -> bool:
        return request.headers.get("x-user") in ("alice", "bob")

    def identity(self, request: Request) -> str:
        return request.headers["x-user"]


def test_a_signed_out_request_gets_no_cookie_and_sees_nothing_of_the_store(store: Store) -> None:
    app, s = store
    with TestClient(create_app(app, auth=token_auth(TOKEN))) as client:
        refused = client.get("/queues")
        assert refused.status_code == 401
        assert "set-cookie" not in refused.headers
        assert app.location not in refused.text and "conveyor.db" not in refused.text
        # The attack of another port of the same host: whatever the 401 page
        # gave, planted as a cookie, with its value in the form, is refused.
        planted = {**BEARER, "cookie": "conveyor_csrf=abc.def"}
        forged = client.post(
            f"/tasks/{s.failed}/delete", headers=planted, data={"csrf_token": "abc"}
        )
        assert forged.status_code == 403
    assert state_of(app, s.failed) is TaskState.FAILED


@pytest.mark.parametrize("auth", ["token", "basic", "hook"])
def test_a_pair_taken_by_another_visitor_and_planted_is_refused(store: Store, auth: str) -> None:
    """The attack of a page on another port of the same host: it takes a
    cookie and a form token as it can (the 401 page when it has no way in,
    its own page when it is another user of the host application), plants
    the cookies in the operator's browser and posts the token with the
    operator's credentials. The token answers only its own identity."""
    app, s = store
    encoded = base64.b64encode(b"ops:pw").decode()
    attacker: dict[str, str] = {}
    if auth == "token":
        web, operator = create_app(app, auth=token_auth(TOKEN)), BEARER
    elif auth == "basic":
        web, operator = (
            create_app(app, auth=basic_auth("ops", "pw")),
            {"authorization": f"Basic {encoded}"},
        )
    else:
        web, operator = create_app(app, auth=TwoUsers()), {"x-user": "bob"}
        attacker = {"x-user": "alice"}
    with TestClient(web) as thief, TestClient(web) as victim:
        taken = thief.get("/failed", headers=attacker)
        found = CSRF.search(taken.text)
        cookies = list(thief.cookies.items())
        token = found.group(1) if found else (cookies[0][1].split(".")[0] if cookies else "")
        for name, value in cookies:
            victim.cookies.set(name, value)
        for path in (
            "/failed/retry-all",
            f"/tasks/{s.failed}/delete",
            f"/tasks/{s.pending}/cancel",
        ):
            planted = victim.post(path, headers=operator, data={"csrf_token": token})
            assert planted.status_code == 403, (path, planted.text)
        assert (
            victim.post(
                "/queues/pause", headers=operator, data={"csrf_token": token, "queue": "work"}
            ).status_code
            == 403
        )
        assert state_of(app, s.failed) is TaskState.FAILED
        assert state_of(app, s.pending) is TaskState.PENDING and app.pauses() == []
        own = token_in(victim.get("/failed", headers=operator).text)
        done = victim.post(f"/tasks/{s.failed}/retry", headers=operator, data={"csrf_token": own})
        assert done.status_code == 200 and state_of(app, s.failed) is TaskState.PENDING


@pytest.mark.parametrize(
    ("headers", "allowed"),
    [
        ({"origin": "http://testserver"}, True),
        ({"origin": "http://127.0.0.1:8081"}, False),
        ({"origin": "http://testserver:8081"}, False),
        ({"origin": "null"}, False),
        ({"origin": "http://evil.example"}, False),
        ({"sec-fetch-site": "same-origin"}, True),
        ({"sec-fetch-site": "none"}, True),
        ({"sec-fetch-site": "same-site"}, False),
        ({"sec-fetch-site": "cross-site"}, False),
        ({"origin": "http://testserver", "sec-fetch-site": "same-site"}, True),
        ({}, True),  # a script: the token alone decides
    ],
)
def test_a_post_from_another_origin_is_refused_before_its_form_is_read(
    store: Store, headers: dict[str, str], allowed: bool
) -> None:
    app, s = store
    with TestClient(create_app(app, auth=token_auth(TOKEN))) as client:
        token = token_in(client.get("/queues", headers=BEARER).text)
        posted = client.post(
            "/queues/pause",
            headers={**BEARER, **headers},
            data={"csrf_token": token, "queue": "work"},
        )
        # A refusal comes before the body is read: an upload is not even looked at.
        upload = client.post(
            "/failed/retry-all", headers={**BEARER, **headers}, files={"f": ("f", b"x")}
        )
    if allowed:
        assert posted.status_code == 200 and [p.name for p in app.pauses()] == ["work"]
        assert upload.status_code == 415
    else:
        assert posted.status_code == 403 and "another site" in posted.text
        assert upload.status_code == 403
        assert app.pauses() == []
    assert state_of(app, s.failed) is TaskState.FAILED


def test_every_response_carries_the_security_headers(store: Store) -> None:
    app, s = store
    with TestClient(create_app(app, auth=token_auth(TOKEN))) as client:
        for path in ("/", "/queues", "/tasks", f"/tasks/{s.failed}", "/failed", "/metrics"):
            page = client.get(path, headers=BEARER)
            assert page.status_code == 200, path
            assert page.headers["content-security-policy"] == CSP, path
            assert page.headers["x-frame-options"] == "DENY"
            assert page.headers["x-content-type-options"] == "nosniff"
            assert page.headers["referrer-policy"] == "same-origin"
            assert page.headers["cache-control"] == "no-store", path
        for refused in (client.get("/"), client.get("/nowhere", headers=BEARER)):
            assert refused.headers["content-security-policy"] == CSP
            assert refused.headers["cache-control"] == "no-store"
        style = client.get("/static/dashboard.css")
        assert style.headers["x-content-type-options"] == "nosniff"
        assert "no-store" not in style.headers.get("cache-control", "")
        script = client.get("/static/dashboard.js")
        assert script.status_code == 200 and "data-select-all" in script.text
        failed = client.get("/failed", headers=BEARER).text
        assert " on" + "click=" not in failed and "<script>" not in failed
        assert "/static/dashboard.js" in failed and "data-select-all" in failed


def test_an_error_while_answering_is_a_page_never_a_bare_500(store: Store) -> None:
    app, _ = store

    def broken(request: Request) -> bool:
        raise RuntimeError("the host application's session store is away")

    with TestClient(create_app(app, auth=broken), raise_server_exceptions=False) as client:
        page = client.get("/")
    assert page.status_code == 500
    assert page.headers["content-type"].startswith("text/html")
    assert "RuntimeError" in page.text and "session store" not in page.text
    assert page.headers["content-security-policy"] == CSP


def test_only_allowed_host_names_are_answered(store: Store) -> None:
    app, _ = store
    with TestClient(create_app(app)) as local:  # no auth: this machine's names only
        for host in ("evil.example", "evil.example:80", "testserver", "127.0.0.2", "[::2]:80"):
            refused = local.get("/", headers={"host": host})
            assert refused.status_code == 400, host
            assert app.location not in refused.text and "<nav>" not in refused.text
            assert "set-cookie" not in refused.headers
        for host in ("localhost", "localhost:8080", "127.0.0.1:9", "[::1]:8080", "LOCALHOST"):
            assert local.get("/", headers={"host": host}).status_code == 200, host
        assert (
            local.get("/static/dashboard.css", headers={"host": "evil.example"}).status_code == 400
        )
    named = create_app(app, allowed_hosts=["Dash.Example", "::1"])
    with TestClient(named) as client:
        assert client.get("/", headers={"host": "dash.example:443"}).status_code == 200
        assert client.get("/", headers={"host": "[::1]"}).status_code == 200
        assert client.get("/", headers={"host": "localhost"}).status_code == 400
    with TestClient(create_app(app, auth=token_auth(TOKEN))) as signed:  # a credential: any host
        assert signed.get("/", headers={**BEARER, "host": "dash.example"}).status_code == 200
    with TestClient(create_app(app, auth=token_auth(TOKEN), allowed_hosts=["a.example"])) as both:
        assert both.get("/", headers={**BEARER, "host": "b.example"}).status_code == 400
    with TestClient(create_app(app, allowed_hosts=["*"])) as anywhere:
        assert anywhere.get("/", headers={"host": "b.example"}).status_code == 200
    for bad in ([], ["a.example:80"], [""], ["a b"], ["http://a.example"]):
        with pytest.raises(ConfigurationError):
            checked_hosts(bad)


def test_redirects_are_paths_never_built_from_the_host(store: Store) -> None:
    app, s = store
    with TestClient(create_app(app, auth=token_auth(TOKEN))) as client:
        forged = {"host": "evil.example"}
        login = client.get(
            f"/tasks?token={TOKEN}&state=failed", headers=forged, follow_redirects=False
        )
        assert login.status_code == 303 and login.headers["location"] == "/tasks?state=failed"
        sneaky = client.get(
            f"http://testserver//evil.example/?token={TOKEN}", follow_redirects=False
        )
        assert sneaky.status_code == 303 and sneaky.headers["location"] == "/evil.example/"
        jump = client.get(
            "/tasks",
            params={"id": str(s.failed)},
            headers={**BEARER, **forged},
            follow_redirects=False,
        )
        assert jump.headers["location"] == f"/tasks/{s.failed}"
        token = token_in(client.get("/queues", headers=BEARER).text)
        moved = client.post(
            f"/tasks/{s.failed}/retry",
            headers={**BEARER, **forged},
            data={"csrf_token": token},
            follow_redirects=False,
        )
        assert moved.status_code == 303
        assert moved.headers["location"] == f"/tasks/{s.failed}?notice=retried&task={s.failed}"
    mounted = Starlette(routes=[Mount("/ops", app=create_app(app, auth=token_auth(TOKEN)))])
    with TestClient(mounted) as client:
        login = client.get(f"/ops/queues?token={TOKEN}", follow_redirects=False)
        assert login.headers["location"] == "/ops/queues"


def test_a_post_body_is_bounded_and_uploads_are_refused(store: Store) -> None:
    app, s = store
    with TestClient(create_app(app, auth=token_auth(TOKEN))) as client:
        token = token_in(client.get("/failed", headers=BEARER).text)
        fields = {"csrf_token": token, "task": str(s.failed)}
        upload = client.post(
            "/failed/retry", headers=BEARER, data=fields, files={"big": ("big.bin", b"x" * 1000)}
        )
        assert upload.status_code == 415
        padded = {**fields, "pad": "x" * MOST_BODY}
        assert client.post("/failed/retry", headers=BEARER, data=padded).status_code == 413

        def chunks() -> Iterator[bytes]:
            yield f"csrf_token={token}&task={s.failed}&pad=".encode()
            for _ in range(MOST_BODY // 1024 + 1):
                yield b"x" * 1024

        chunked = client.post(
            "/failed/retry",
            headers={**BEARER, "content-type": "application/x-www-form-urlencoded"},
            content=chunks(),
        )
        assert chunked.status_code == 413
        lying = client.post(
            "/failed/retry", headers={**BEARER, "content-length": "1e9"}, data=fields
        )
        assert lying.status_code in (400, 413)
        assert state_of(app, s.failed) is TaskState.FAILED
        small = client.post("/failed/retry", headers=BEARER, data=fields)
        assert small.status_code == 200 and state_of(app, s.failed) is TaskState.PENDING


@pytest.mark.parametrize(
    "query",
    [
        "/tasks?before=\u00b2",
        "/failed?before=\u00b2",
        "/tasks?parent=\u0663",
        "/tasks?id=%2B12",
        "/tasks?name=%00",
        "/tasks?notice=deleted&task=%00",
        "/queues?x=a%00b",
    ],
)
def test_bad_query_text_answers_400(store: Store, query: str) -> None:
    app, _ = store
    with TestClient(create_app(app, allowed_hosts=HOSTS)) as client:
        page = client.get(query)
    assert page.status_code == 400, page.text


def test_a_notice_shows_only_what_an_action_could_have_given(store: Store) -> None:
    app, _ = store
    with TestClient(create_app(app, allowed_hosts=HOSTS)) as client:

        def notice(path: str) -> str:
            page = client.get(path)
            assert page.status_code == 200, path
            found = page.text.split('class="notice" role="status">')
            return found[1].split("</p>")[0] if len(found) > 1 else ""

        assert notice("/tasks?notice=deleted&task=12") == (
            "Task 12 is deleted, with its attempt log and messages."
        )
        for bad in ("Call%20support%20at%20555", "12%20or%20call%20us", "%C2%B2", "1" * 19):
            assert notice(f"/tasks?notice=deleted&task={bad}") == "", bad
        assert notice("/failed?notice=retried_many&n=3") == "3 failed task(s) are pending again."
        assert notice("/failed?notice=retried_many&n=all%20your") == ""
        assert notice("/queues?notice=paused&queue=work") == ""  # not paused
        assert notice("/queues?notice=resumed&queue=Send%20money") == ""  # no such queue
        assert notice("/queues?notice=resumed&queue=work") == "Queue work is resumed."
        app.pause(queue="work")
        assert notice("/queues?notice=paused&queue=work").startswith("Queue work is paused")
        assert notice("/queues?notice=resumed&queue=work") == ""


def test_the_login_cookie_is_signed_and_expires(store: Store) -> None:
    app, _ = store
    web = create_app(app, auth=token_auth(TOKEN), secret="k")
    with TestClient(web) as client:
        login = client.get(f"/?token={TOKEN}", follow_redirects=False)
        cookie = login.headers["set-cookie"]
        assert cookie.startswith("conveyor_token=") and TOKEN not in cookie
        assert f"Max-Age={COOKIE_LIFETIME}" in cookie
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/;" in cookie
        assert client.get("/").status_code == 200
        value = client.cookies["conveyor_token"]
        digest = value.split(".")[0]
        stale = Signer(b"k").stamp("login", digest, now=time.time() - COOKIE_LIFETIME - 1)
        client.cookies.clear()
        client.cookies.set("conveyor_token", stale)
        assert client.get("/").status_code == 401
        forged = ".".join([digest, "9999999999", "0" * 64])
        client.cookies.clear()
        client.cookies.set("conveyor_token", forged)
        assert client.get("/").status_code == 401
    restarted = create_app(app, auth=token_auth(TOKEN))  # another (random) secret
    with TestClient(restarted, cookies={"conveyor_token": value}) as client:
        assert client.get("/").status_code == 401
    with TestClient(create_app(app, auth=token_auth(TOKEN), secret="k")) as client:
        client.cookies.set("conveyor_token", value)
        assert client.get("/").status_code == 200  # the same secret: the same sign-in


def test_cookies_over_https_are_host_prefixed_at_the_root_and_plain_under_a_mount(
    store: Store,
) -> None:
    app, _ = store
    with TestClient(
        create_app(app, auth=token_auth(TOKEN)), base_url="https://testserver"
    ) as client:
        login = client.get(f"/?token={TOKEN}", follow_redirects=False)
        cookie = login.headers["set-cookie"]
        assert cookie.startswith("__Host-conveyor_token=") and "Secure" in cookie
        assert "Path=/;" in cookie and "Domain" not in cookie
        assert client.get("/").status_code == 200
    hook = create_app(app, auth=TwoUsers())
    mounted = Starlette(routes=[Mount("/ops", app=hook)])
    with TestClient(mounted, base_url="https://testserver") as client:
        page = client.get("/ops/queues", headers={"x-user": "alice"})
        assert page.status_code == 200
        assert "set-cookie" not in page.headers  # the hook names who signed in: no session
    with TestClient(
        Starlette(routes=[Mount("/ops", app=create_app(app, allowed_hosts=["*"]))]),
        base_url="https://testserver",
    ) as client:
        session = client.get("/ops/queues").headers["set-cookie"]
        assert session.startswith("conveyor_session=") and "Path=/ops/" in session
        assert "Secure" in session
