"""Every page, the actions, CSRF, authentication, read-only and mounting,
through HTTP (no browser), on memory, SQLite and PostgreSQL."""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta

import pytest
from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.testclient import TestClient

import conveyor
from conveyor.dashboard import basic_auth, create_app, token_auth
from conveyor.model import TaskState
from tests.dashboard.conftest import HOSTS, csrf_of
from tests.dashboard.seed import Seeded

Store = tuple[conveyor.App, Seeded]


def state_of(app: conveyor.App, task_id: int) -> TaskState | None:
    found = app.get(task_id)
    return None if found is None else found.state


def test_every_page_shows_the_store(store: Store) -> None:
    app, s = store
    with TestClient(create_app(app, allowed_hosts=HOSTS)) as client:
        page = client.get("/")
        assert page.status_code == 200
        assert "Tasks by queue and state" in page.text and "<svg" in page.text
        assert ">work</a>" in page.text and ">flaky</a>" in page.text
        assert "1 succeeded" in page.text and "3 failed" in page.text  # the last hour's chart
        assert "w1" in page.text  # the live worker

        queues = client.get("/queues").text
        assert "mail" in queues and "Pause" in queues and "none due" in queues

        tasks = client.get("/tasks").text
        assert f'href="http://testserver/tasks/{s.pending}"' in tasks
        failed_only = client.get("/tasks", params={"state": "failed"}).text
        assert f"/tasks/{s.failed}" in failed_only and f'/tasks/{s.pending}"' not in failed_only
        in_mail = client.get("/tasks", params={"queue": "mail"}).text
        assert f"/tasks/{s.later}" in in_mail and f'/tasks/{s.failed}"' not in in_mail

        failed = client.get("/failed").text
        assert (
            "Retry selected" in failed and "ValueError" in failed and "&lt;bad&gt; card" in failed
        )

        workers = client.get("/workers").text
        assert "w1" in workers and "1 live" in workers
        assert client.get("/schedules").status_code == 200

        one = client.get(f"/tasks/{s.failed}").text
        assert "Traceback (most recent call last)" in one and "ValueError" in one
        assert "&lt;bad&gt; card" in one and "<bad>" not in one
        assert ">Retry</button>" in one and ">Cancel</button>" not in one
        done = client.get(f"/tasks/{s.succeeded}").text
        assert "Result" in done and "42" in done
        running = client.get(f"/tasks/{s.running}").text
        assert ">Cancel</button>" in running and ">Delete</button>" not in running
        # Its progress report: a bar and the summary, the stored note escaped.
        assert '<progress max="100" value="37">' in running
        assert "37 of 100 (37%): &lt;b&gt;resizing&lt;/b&gt;" in running
        assert "<b>resizing</b>" not in running
        assert "<progress" not in client.get(f"/tasks/{s.pending}").text


def test_a_task_page_shows_step_inbox_explanation_and_escapes(store: Store) -> None:
    app, s = store
    with TestClient(create_app(app, allowed_hosts=HOSTS)) as client:
        step = client.get(f"/tasks/{s.step}").text
        assert "charge" in step and "&#34;cart&#34;: 7" in step
        chat = client.get(f"/tasks/{s.chat}").text
        assert "2 unread message(s)" in chat and "&lt;world&gt;" in chat
        assert "Children" in chat and f'/tasks/{s.child}"' in chat
        children = client.get(f"/tasks?parent={s.chat}").text
        assert f'/tasks/{s.child}"' in children and f'/tasks/{s.pending}"' not in children
        assert client.get("/tasks?parent=x").status_code == 400
        waiting = client.get(f"/tasks/{s.waiting}").text
        assert "waiting" in waiting and app.explain(s.waiting).sentence.split(":")[0] in waiting
        escaped = client.get(f"/tasks/{s.escaped}").text
        assert "<script>alert" not in escaped and "&lt;script&gt;alert(1)" in escaped
        big = client.get(f"/tasks/{s.big}").text
        assert "Shown: the first 65,536 bytes of" in big and len(big) < 90_000


def test_a_task_page_lists_its_dependencies_counted_by_state(store: Store) -> None:
    app, s = store

    @app.task(name="job")
    def job() -> None:
        return None

    waits = job.options(after=[s.failed, s.pending, s.succeeded], on_dependency_failure="run")
    waits_handle = waits.enqueue()
    plain = job.enqueue()
    with TestClient(create_app(app, allowed_hosts=HOSTS)) as client:
        page = client.get(f"/tasks/{waits_handle.id}").text
        assert "Dependencies <small>3, 1 not ended</small>" in page
        for task_id in (s.failed, s.pending, s.succeeded):
            assert f'/tasks/{task_id}"' in page
        assert "ValueError</span>: &lt;bad&gt; card" in page  # the failed one's error, escaped
        assert 'state-failed">failed</span> 1' in page and 'state-pending">pending</span> 1' in page
        assert "dependencies" in page  # the explanation's reason
        assert "Dependencies <small>" not in client.get(f"/tasks/{plain.id}").text


def test_a_task_graph_page_draws_its_tasks_and_acts_on_them(store: Store) -> None:
    app, s = store

    @app.task(name="job")
    def job() -> None:
        return None

    members = [job.enqueue().id for _ in range(2)]
    callback = job.options(after=[*members, s.failed], on_dependency_failure="run").enqueue().id
    nodes = [*members, s.failed, callback]
    with TestClient(create_app(app, allowed_hosts=HOSTS)) as client:
        member_page = client.get(f"/tasks/{members[0]}").text
        assert "1 task(s) wait for this one" in member_page
        assert f'href="http://testserver/tasks/{members[0]}/graph"' in member_page
        callback_page = client.get(f"/tasks/{callback}").text
        assert f'href="http://testserver/tasks/{callback}/graph"' in callback_page
        assert "/graph" not in client.get(f"/tasks/{s.pending}").text  # no edge, no graph

        page = client.get(f"/tasks/{members[1]}/graph")
        assert page.status_code == 200
        text = page.text
        assert "4 task(s), 3 edge(s)" in text and '<svg class="graph"' in text
        for task_id in nodes:
            assert f'<a href="http://testserver/tasks/{task_id}"><g class="state-' in text
        assert f'<g class="state-pending current"><title>task {members[1]} job: pending' in text
        assert 'state-failed">failed</span> 1' in text and 'state-waiting">waiting</span> 1' in text
        assert text.count("<line") == 3
        assert "Retry failed (1)" in text and "Cancel not ended (3)" in text

        token = csrf_of(client, f"/tasks/{callback}/graph")
        retried = client.post(f"/tasks/{callback}/graph/retry-failed", data={"csrf_token": token})
        assert (
            retried.is_success and "1 failed task(s) of the graph are pending again" in retried.text
        )
        assert state_of(app, s.failed) is TaskState.PENDING
        cancelled = client.post(f"/tasks/{members[0]}/graph/cancel", data={"csrf_token": token})
        assert cancelled.is_success and "task(s) of the graph are cancelled" in cancelled.text
        assert {state_of(app, i) for i in nodes} == {TaskState.CANCELLED}
        assert "Cancel not ended" not in cancelled.text and "<button" not in cancelled.text

        assert client.post(f"/tasks/{callback}/graph/cancel").status_code == 403
        assert (
            client.post(f"/tasks/{callback}/graph/x", data={"csrf_token": token}).status_code == 404
        )
        assert (
            client.post("/tasks/999999/graph/cancel", data={"csrf_token": token}).status_code == 404
        )
        missing = client.get("/tasks/999999/graph")
        assert missing.status_code == 404 and "No task has id 999999" in missing.text
    with TestClient(create_app(app, read_only=True, allowed_hosts=HOSTS)) as client:
        assert "<button" not in client.get(f"/tasks/{callback}/graph").text


def test_a_wide_graph_draws_the_first_tasks_of_a_layer_and_one_more_box(store: Store) -> None:
    app, _ = store

    @app.task(name="job")
    def job() -> None:
        return None

    members = [h.id for h in conveyor.group(job.s() for _ in range(30)).enqueue()]
    callback = job.options(after=members).enqueue().id
    with TestClient(create_app(app, allowed_hosts=HOSTS)) as client:
        text = client.get(f"/tasks/{callback}/graph").text
    assert "31 task(s), 30 edge(s)" in text and "+6 more" in text
    assert f'/tasks/{members[23]}"' in text and f'/tasks/{members[24]}"' not in text
    assert text.count("<line") == 24 and "6 task(s) not drawn" in text


@pytest.mark.parametrize(
    ("path", "status", "says"),
    [
        ("/tasks/999999", 404, "No task has id 999999"),
        ("/tasks?state=bogus", 400, "unknown state &#39;bogus&#39;"),
        ("/tasks?before=abc", 400, "before must be a task id"),
        ("/failed?before=-3", 400, "before must be a task id"),
        ("/tasks?id=12x", 400, "id must be a task id"),
        ("/nowhere", 404, "Not found"),
    ],
)
def test_bad_addresses_answer_with_a_page(store: Store, path: str, status: int, says: str) -> None:
    app, _ = store
    with TestClient(create_app(app, allowed_hosts=HOSTS)) as client:
        page = client.get(path)
    assert page.status_code == status
    assert says in page.text and "<nav>" in page.text


def test_jump_to_a_task_by_id_and_page_with_before(store: Store) -> None:
    app, s = store
    with TestClient(create_app(app, page_size=3, allowed_hosts=HOSTS)) as client:
        jump = client.get("/tasks", params={"id": str(s.failed)}, follow_redirects=False)
        assert jump.status_code == 303 and jump.headers["location"].endswith(f"/tasks/{s.failed}")
        first = client.get("/tasks").text
        newest = sorted(t.id for t in app.list_tasks(limit=1000))[::-1]
        assert f"before={newest[2]}" in first and "Next page" in first
        second = client.get("/tasks", params={"before": newest[2]}).text
        assert f'/tasks/{newest[3]}"' in second and f'/tasks/{newest[2]}"' not in second


def test_a_post_without_the_csrf_token_changes_nothing(store: Store) -> None:
    app, s = store
    with TestClient(create_app(app, allowed_hosts=HOSTS)) as client:
        assert client.post(f"/tasks/{s.failed}/retry").status_code == 403
        csrf_of(client)  # the cookie, but a wrong field
        wrong = client.post(f"/tasks/{s.failed}/retry", data={"csrf_token": "forged"})
        assert wrong.status_code == 403 and "security token" in wrong.text
        assert client.post("/queues/pause", data={"queue": "work"}).status_code == 403
        assert client.post("/failed/retry-all").status_code == 403
    assert state_of(app, s.failed) is TaskState.FAILED
    assert app.pauses() == []
    with TestClient(
        create_app(app, allowed_hosts=HOSTS)
    ) as other:  # another client's token, without its cookie
        token = csrf_of(TestClient(create_app(app, allowed_hosts=HOSTS)))
        assert other.post(f"/tasks/{s.failed}/retry", data={"csrf_token": token}).status_code == 403


def test_actions_change_the_store(store: Store) -> None:
    app, s = store
    with TestClient(create_app(app, allowed_hosts=HOSTS)) as client:
        token = csrf_of(client)
        page = client.post(f"/tasks/{s.failed}/retry", data={"csrf_token": token})
        assert page.status_code == 200 and "pending again" in page.text
        assert state_of(app, s.failed) is TaskState.PENDING
        assert client.post(f"/tasks/{s.pending}/cancel", data={"csrf_token": token}).is_success
        assert state_of(app, s.pending) is TaskState.CANCELLED
        client.post(f"/tasks/{s.running}/cancel", data={"csrf_token": token})
        cancelled = app.get(s.running)
        assert cancelled is not None and cancelled.cancel_requested
        assert client.post(f"/tasks/{s.later}/run-now", data={"csrf_token": token}).is_success
        later = app.get(s.later)
        assert later is not None and later.run_at <= datetime.now(UTC) + timedelta(seconds=5)
        deleted = client.post(f"/tasks/{s.succeeded}/delete", data={"csrf_token": token})
        assert deleted.is_success and "is deleted" in deleted.text
        assert app.get(s.succeeded) is None
        refused = client.post(f"/tasks/{s.cancelled}/cancel", data={"csrf_token": token})
        assert refused.status_code == 409
        assert client.post("/queues/pause", data={"csrf_token": token, "queue": "work"}).is_success
        assert [p.name for p in app.pauses()] == ["work"]
        assert "Resume" in client.get("/queues").text
        assert client.post("/queues/resume", data={"csrf_token": token, "queue": "work"}).is_success
        assert app.pauses() == []


def test_bulk_retry_of_failed_tasks(store: Store) -> None:
    app, s = store
    with TestClient(create_app(app, allowed_hosts=HOSTS)) as client:
        token = csrf_of(client, "/failed")
        one = s.failed_more[0]
        page = client.post("/failed/retry", data={"csrf_token": token, "task": [str(one)]})
        assert "1 failed task(s) are pending again" in page.text
        assert state_of(app, one) is TaskState.PENDING
        assert state_of(app, s.failed) is TaskState.FAILED
        assert (
            client.post("/failed/retry", data={"csrf_token": token, "task": "x"}).status_code == 400
        )
        page = client.post("/failed/retry-all", data={"csrf_token": token})
        assert "2 failed task(s) are pending again" in page.text
    assert app.list_tasks(state="failed") == []


def test_retry_selected_leaves_a_task_cancelled_since_the_page_was_drawn(store: Store) -> None:
    app, s = store
    with TestClient(create_app(app, allowed_hosts=HOSTS)) as client:
        token = csrf_of(client, "/failed")  # the page lists failed_more as failed...
        raced = s.failed_more[0]
        app.retry(raced)  # ...then another operator retries it and cancels it
        app.cancel(raced)
        ticked = [str(raced), str(s.cancelled), str(s.failed)]
        page = client.post("/failed/retry", data={"csrf_token": token, "task": ticked})
        assert "1 failed task(s) are pending again" in page.text
    assert state_of(app, raced) is TaskState.CANCELLED
    assert state_of(app, s.cancelled) is TaskState.CANCELLED
    assert state_of(app, s.failed) is TaskState.PENDING


def test_token_auth_refuses_then_lets_in(store: Store) -> None:
    app, s = store
    with TestClient(create_app(app, auth=token_auth("s3cret"))) as client:
        assert client.get("/").status_code == 401
        assert client.get("/metrics").status_code == 401
        assert client.get("/", headers={"Authorization": "Bearer nope"}).status_code == 401
        assert client.post(f"/tasks/{s.failed}/retry").status_code == 401
        assert client.get("/", headers={"Authorization": "Bearer s3cret"}).status_code == 200
        assert client.get("/static/dashboard.css").status_code == 200
        login = client.get("/tasks?token=s3cret&state=failed", follow_redirects=False)
        assert login.status_code == 303
        assert login.headers["location"] == "/tasks?state=failed"
        assert "s3cret" not in login.headers["set-cookie"]
        assert client.get("/tasks").status_code == 200  # the cookie lets in from now on
    assert state_of(app, s.failed) is TaskState.FAILED


def test_basic_auth_challenges(store: Store) -> None:
    app, _ = store
    with TestClient(create_app(app, auth=basic_auth("ops", "pw"))) as client:
        refused = client.get("/")
        assert refused.status_code == 401
        assert refused.headers["www-authenticate"].startswith("Basic")
        wrong = base64.b64encode(b"ops:nope").decode()
        assert client.get("/", headers={"Authorization": f"Basic {wrong}"}).status_code == 401
        assert client.get("/", auth=("ops", "pw")).status_code == 200


def test_an_async_auth_hook_is_awaited(store: Store) -> None:
    app, _ = store

    async def only_header(request: object) -> bool:
        return getattr(request, "headers", {}).get("x-ok") == "1"

    with TestClient(create_app(app, auth=only_header)) as client:
        assert client.get("/").status_code == 401
        assert client.get("/", headers={"x-ok": "1"}).status_code == 200


def test_read_only_shows_no_action_and_refuses_posts(store: Store) -> None:
    app, s = store
    with TestClient(create_app(app, read_only=True, allowed_hosts=HOSTS)) as client:
        page = client.get(f"/tasks/{s.failed}").text
        assert "read-only" in page and "<button" not in page
        assert "<button" not in client.get("/queues").text.split("<main>")[1]
        assert "Retry selected" not in client.get("/failed").text
    with TestClient(create_app(app, allowed_hosts=HOSTS)) as writer:
        token = csrf_of(writer, "/queues")
        with TestClient(create_app(app, read_only=True, secret="k", allowed_hosts=HOSTS)) as client:
            client.cookies.update(writer.cookies)
            refused = client.post(f"/tasks/{s.failed}/retry", data={"csrf_token": token})
            assert refused.status_code == 403 and "read-only" in refused.text
    assert state_of(app, s.failed) is TaskState.FAILED


def test_mounted_under_a_prefix(store: Store) -> None:
    app, s = store
    host = Starlette(routes=[Mount("/ops", app=create_app(app, allowed_hosts=HOSTS))])
    with TestClient(host) as client:
        first = client.get("/ops/")
        assert "Path=/ops/" in first.headers["set-cookie"]
        page = first.text
        assert 'href="http://testserver/ops/tasks"' in page
        assert 'href="http://testserver/ops/static/dashboard.css"' in page
        assert 'href="http://testserver/tasks"' not in page
        queues = client.get("/ops/queues")
        assert 'action="http://testserver/ops/queues/pause"' in queues.text
        token = csrf_of(client, "/ops/queues")
        moved = client.post(f"/ops/tasks/{s.failed}/retry", data={"csrf_token": token})
        assert moved.status_code == 200 and str(moved.url).endswith(
            f"/ops/tasks/{s.failed}?notice=retried&task={s.failed}"
        )
    assert state_of(app, s.failed) is TaskState.PENDING


def test_mounted_in_fastapi(store: Store) -> None:
    from fastapi import FastAPI

    app, s = store
    web = FastAPI()
    web.mount("/conveyor", create_app(app, auth=token_auth("s3cret")))
    with TestClient(web) as client:
        assert client.get("/conveyor/").status_code == 401
        page = client.get(f"/conveyor/tasks/{s.failed}", headers={"authorization": "Bearer s3cret"})
        assert page.status_code == 200
        assert 'href="http://testserver/conveyor/failed"' in page.text


def test_metrics_are_the_store_gauges(store: Store) -> None:
    app, _ = store
    with TestClient(create_app(app, allowed_hosts=HOSTS)) as client:
        scraped = client.get("/metrics")
    assert scraped.status_code == 200
    assert scraped.headers["content-type"].startswith("text/plain")
    assert 'conveyor_store_tasks{queue="work",state="failed"} 1.0' in scraped.text
    assert "conveyor_live_workers 1.0" in scraped.text


def test_hostile_cookies_and_headers_are_refused_never_a_crash(store: Store) -> None:
    app, s = store
    hostile = "t\u00e9.\u00e9\u20ac".encode()
    with TestClient(create_app(app, auth=token_auth("s3cret"))) as client:
        for header in (b"Bearer " + hostile, b"Basic " + hostile, b"Bearer", hostile):
            page = client.get("/", headers={"authorization": header})
            assert page.status_code == 401
        assert client.get("/?token=\u00e9\u20ac").status_code == 401
        inside = {"authorization": "Bearer s3cret"}
        cookie = b"conveyor_csrf=" + hostile
        posted = client.post(
            f"/tasks/{s.failed}/retry",
            headers={**inside, "cookie": cookie},
            data={"csrf_token": "t\u00e9"},
        )
        assert posted.status_code == 403
        assert client.get("/tasks/99999999999999999999", headers=inside).status_code in (400, 404)
    assert state_of(app, s.failed) is TaskState.FAILED
