"""The recipes of docs/recipes.md run as written: FastAPI, Django and Flask
apps that enqueue (the docs include these very files), the worker's systemd
unit, its container entrypoint and Dockerfile."""

from __future__ import annotations

import configparser
import importlib.util
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import psycopg
import pytest
from psycopg import sql

import conveyor
import conveyor.testing
from conveyor import TaskState
from conveyor.cli import main
from conveyor.worker.config import DEFAULT_STOP_TIMEOUT
from tests.conftest import PG_URL, drop_schema, new_schema_name

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "examples" / "recipes"

Loader = Callable[[str], ModuleType]


def create_schema(name: str) -> None:
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(sql.SQL("create schema {}").format(sql.Identifier(name)))


def close_apps(module: ModuleType) -> None:
    for value in vars(module).values():
        if isinstance(value, conveyor.Client):
            value.close()


@pytest.fixture
def load_recipe() -> Iterator[Loader]:
    """Import ``examples/recipes/NAME`` afresh, as its own module: its App
    reads the environment when it is built. Its apps are closed afterwards."""
    loaded: list[ModuleType] = []

    def load(name: str) -> ModuleType:
        module_name = f"recipe_{Path(name).stem}_{uuid.uuid4().hex[:8]}"
        spec = importlib.util.spec_from_file_location(module_name, RECIPES / name)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        loaded.append(module)
        spec.loader.exec_module(module)
        return module

    yield load
    for module in loaded:
        close_apps(module)
        sys.modules.pop(module.__name__, None)


# -- FastAPI -------------------------------------------------------------------


@pytest.fixture
def fastapi_recipe(schema: str, monkeypatch: pytest.MonkeyPatch, load_recipe: Loader) -> ModuleType:
    """The FastAPI recipe on the test database: its tasks in the test's
    schema, its own ``orders`` table there too (first on the search path)."""
    create_schema(schema)
    monkeypatch.setenv("DATABASE_URL", PG_URL)
    monkeypatch.setenv("CONVEYOR_SCHEMA", schema)
    monkeypatch.setenv("PGOPTIONS", f"-c search_path={schema}")
    return load_recipe("fastapi_app.py")


def test_fastapi_lifespan_opens_the_app_and_a_request_enqueues(fastapi_recipe: Any) -> None:
    from fastapi.testclient import TestClient

    with TestClient(fastapi_recipe.api) as client:
        response = client.post("/welcome", json={"email": "ada@example.com"})
    assert response.status_code == 202, response.text

    task = fastapi_recipe.tasks.get(response.json()["task_id"])
    assert task is not None
    assert (task.name, task.queue, task.state) == ("send_welcome", "mail", TaskState.PENDING)
    assert task.payload == {"email": "ada@example.com"}


def test_fastapi_task_commits_with_the_request_transaction_or_not_at_all(
    fastapi_recipe: Any, schema: str
) -> None:
    from fastapi.testclient import TestClient

    with TestClient(fastapi_recipe.api) as client:
        placed = client.post("/orders", json={"reference": "A-1", "cents": 1999})
        # The same reference again: the insert fails after the enqueue, and the
        # rollback removes that task with the order.
        refused = client.post("/orders", json={"reference": "A-1", "cents": 5})
    assert placed.status_code == 201, placed.text
    assert refused.status_code == 409, refused.text

    tasks = fastapi_recipe.tasks
    charge_task = placed.json()["charge_task"]
    assert [t.id for t in tasks.list_tasks(name="charge_order")] == [charge_task]
    # The refused request did insert its task (ids are not reused after a
    # rollback): the rollback took it away.
    assert fastapi_recipe.send_welcome.enqueue(email="next@example.com").id > charge_task + 1
    with psycopg.connect(PG_URL) as conn:
        query = sql.SQL("select reference, cents, charge_task from {}")
        rows = conn.execute(query.format(sql.Identifier(schema, "orders"))).fetchall()
    assert rows == [("A-1", 1999, charge_task)]

    assert conveyor.testing.drain(tasks, queues=["default"]) == 1
    assert tasks.get(charge_task).result == "charged 1999 for A-1"


# -- Django --------------------------------------------------------------------


def django_databases(schema: str, site_default: dict[str, Any]) -> dict[str, Any]:
    """The recipe's DATABASES, on the test database, with ``schema`` first on
    the search path (the recipe takes the rest from libpq's environment)."""
    params = psycopg.conninfo.conninfo_to_dict(PG_URL)
    default = {
        **site_default,
        "NAME": params["dbname"],
        "HOST": params.get("host", ""),
        "PORT": params.get("port", ""),
        "USER": params.get("user", ""),
        "PASSWORD": params.get("password", ""),
        "OPTIONS": {"options": f"-c search_path={schema}"},
    }
    return {"default": default}


@pytest.fixture(scope="module")
def django_site() -> Iterator[SimpleNamespace]:
    """Django configured in this process with the recipe's settings, on one
    schema of its own for this module: the signups table and the tasks."""
    import django
    from django.conf import settings

    schema = new_schema_name()
    create_schema(schema)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CONVEYOR_URL", PG_URL)
        patch.setenv("CONVEYOR_SCHEMA", schema)
        patch.syspath_prepend(str(RECIPES))
        site_settings = importlib.import_module("django_app.settings")
        values = {name: getattr(site_settings, name) for name in dir(site_settings)}
        values = {name: value for name, value in values.items() if name.isupper()}
        values["DATABASES"] = django_databases(schema, site_settings.DATABASES["default"])
        values["LOGGING_CONFIG"] = None  # leave this process's logging as it is
        settings.configure(**values)
        django.setup()
        from django.db import connection
        from django_app import models, tasks, views

        tasks.queue.migrate()  # as `conveyor migrate` would at deploy
        with connection.schema_editor() as editor:
            editor.create_model(models.Signup)
        try:
            yield SimpleNamespace(models=models, tasks=tasks, views=views)
        finally:
            tasks.queue.close()
            connection.close()
            drop_schema(schema)
            for name in [n for n in sys.modules if n.split(".")[0] == "django_app"]:
                del sys.modules[name]


def welcome_ids(site: SimpleNamespace) -> set[int]:
    return {t.id for t in site.tasks.queue.list_tasks(name="send_welcome", limit=1000)}


def test_django_view_enqueues_inside_the_request_transaction(
    django_site: SimpleNamespace,
) -> None:
    from django.test import Client

    client = Client()
    response = client.post("/signups/", {"email": "ada@example.com"})
    assert response.status_code == 201, response.content
    body = response.json()
    task = django_site.tasks.queue.get(body["task"])
    assert task is not None
    assert task.payload == {"signup_id": body["signup"]}
    assert task.state is TaskState.PENDING

    before = welcome_ids(django_site)
    again = client.post("/signups/", {"email": "ada@example.com"})
    assert again.status_code == 409
    assert welcome_ids(django_site) == before


def test_django_rollback_takes_the_task_away_with_the_rows(
    django_site: SimpleNamespace,
) -> None:
    from django.db import transaction

    queue, views = django_site.tasks.queue, django_site.views

    with transaction.atomic():
        signup, handle = views.register("bob@example.com")
        # Not committed: no other connection (no worker) can see it yet.
        assert queue.get(handle.id) is None
        transaction.set_rollback(True)
    assert queue.get(handle.id) is None
    assert not django_site.models.Signup.objects.filter(pk=signup.pk).exists()

    with pytest.raises(RuntimeError, match=r"inside transaction\.atomic"):
        views.psycopg_connection()


def test_django_on_commit_enqueues_after_a_commit_and_never_after_a_rollback(
    django_site: SimpleNamespace,
) -> None:
    from django.db import transaction
    from django.test import Client

    queue, views = django_site.tasks.queue, django_site.views

    before = welcome_ids(django_site)
    with transaction.atomic():
        views.register_on_commit("carol@example.com")
        transaction.set_rollback(True)
    assert welcome_ids(django_site) == before

    response = Client().post("/signups/on-commit/", {"email": "carol@example.com"})
    assert response.status_code == 201, response.content
    [new] = welcome_ids(django_site) - before
    task = queue.get(new)
    assert task is not None
    assert task.payload == {"signup_id": response.json()["signup"]}

    assert conveyor.testing.drain(queue) >= 1
    assert queue.get(new).result == f"welcomed signup {response.json()['signup']}"


# -- Flask ---------------------------------------------------------------------


def test_flask_view_enqueues_with_the_sync_api(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, load_recipe: Loader
) -> None:
    monkeypatch.setenv("CONVEYOR_URL", f"sqlite:///{tmp_path / 'tasks.db'}")
    recipe: Any = load_recipe("flask_app.py")

    client = recipe.create_app().test_client()
    response = client.post("/orders/7/receipt", json={"email": "ada@example.com"})
    assert response.status_code == 202
    task_id = response.get_json()["task_id"]
    task = recipe.queue.get(task_id)
    assert task is not None
    assert (task.name, task.queue) == ("send_receipt", "mail")
    assert task.payload == {"order_id": 7, "email": "ada@example.com"}

    assert conveyor.testing.drain(recipe.queue) == 1
    assert recipe.queue.get(task_id).result == "receipt of order 7 sent to ada@example.com"


# -- systemd, container --------------------------------------------------------


def read_unit(path: Path) -> configparser.ConfigParser:
    """A systemd unit file as sections of keys (case kept; no interpolation)."""
    unit = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",))
    unit.optionxform = str  # type: ignore[method-assign]
    unit.read_string(path.read_text())
    return unit


def unit_seconds(value: str) -> float:
    """A systemd time span of the forms the unit uses: ``90``, ``90s``, ``1min 30s``."""
    units = {"": 1, "s": 1, "sec": 1, "min": 60, "m": 60, "h": 3600}
    total = 0.0
    for number, unit in re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", value):
        total += float(number) * units[unit]
    return total


def command_line(service: configparser.SectionProxy, key: str) -> list[str]:
    """``key``'s command line with the unit's ``Environment=`` expanded, as systemd does."""
    environment = dict(item.split("=", 1) for item in shlex.split(service["Environment"]))
    expanded = re.sub(r"\$\{(\w+)\}", lambda m: environment[m.group(1)], service[key])
    return shlex.split(expanded)


def test_systemd_unit_runs_a_real_command_line_and_waits_out_the_drain() -> None:
    service = read_unit(RECIPES / "conveyor-worker.service")["Service"]

    argv = command_line(service, "ExecStart")
    assert Path(argv[0]).name == "conveyor"
    assert argv[1] == "worker"
    # The real command parses these arguments (an unknown flag or a bad value raises).
    with main.commands["worker"].make_context("worker", argv[2:]) as ctx:
        grace = ctx.params["grace"]
        assert ctx.params["url"] == "postgresql://myproject@localhost:5432/myproject"
    assert grace == 30

    migrate = command_line(service, "ExecStartPre")
    assert migrate[1] == "migrate"
    with main.commands["migrate"].make_context("migrate", migrate[2:]):
        pass

    assert service["KillSignal"] == "SIGTERM"
    # Only the worker gets the SIGTERM; it stops its own children.
    assert service["KillMode"] == "mixed"
    # systemd's SIGKILL comes after the grace and the worker's own stop timeout.
    assert unit_seconds(service["TimeoutStopSec"]) > grace + DEFAULT_STOP_TIMEOUT


def test_dockerfile_runs_the_entrypoint_in_exec_form() -> None:
    lines = (RECIPES / "Dockerfile").read_text().splitlines()
    starts = [line for line in lines if line and not line[0].isspace() and line[0] != "#"]
    instructions = dict(line.split(" ", 1) for line in starts)
    assert json.loads(instructions["ENTRYPOINT"]) == ["/usr/local/bin/conveyor-entrypoint"]
    assert instructions["STOPSIGNAL"] == "SIGTERM"


TINY_APP = """
    import pathlib
    import time

    import conveyor

    app = conveyor.App()


    @app.task
    def nap(marker: str, seconds: float) -> str:
        pathlib.Path(marker).write_text("running")
        time.sleep(seconds)
        return "rested"
"""


def entrypoint_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")}
    # The `conveyor` command of this Python, first on the PATH.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return {**env, **extra}


@pytest.mark.slow
def test_entrypoint_refuses_to_start_without_a_store() -> None:
    done = subprocess.run(
        ["bash", str(RECIPES / "entrypoint.sh")],
        env=entrypoint_env(CONVEYOR_APP="tiny:app"),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode != 0
    assert "CONVEYOR_URL" in done.stderr


@pytest.mark.slow
def test_entrypoint_worker_drains_on_sigterm_and_exits_0(tmp_path: Path) -> None:
    (tmp_path / "tiny_tasks.py").write_text(textwrap.dedent(TINY_APP))
    url = f"sqlite:///{tmp_path / 'tasks.db'}"
    marker = tmp_path / "marker"
    with conveyor.App(url, allow_unregistered=True) as client:
        task_id = client.enqueue("nap", {"marker": str(marker), "seconds": 1.0}).id

    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            ["bash", str(RECIPES / "entrypoint.sh"), "--poll-interval", "0.1"],
            cwd=tmp_path,
            env=entrypoint_env(CONVEYOR_URL=url, CONVEYOR_APP="tiny_tasks:app", WORKER_GRACE="20"),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, f"the task never started:\n{log.read_text()}"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)  # to the worker itself: the shell exec'd it
        assert proc.wait(timeout=60) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    with conveyor.App(url, allow_unregistered=True) as client:
        task = client.get(task_id)
    assert task is not None
    # Drained within the grace: the running task finished, nothing was interrupted.
    assert task.state is TaskState.SUCCEEDED, log.read_text()
    assert task.result == "rested"


def test_the_dashboard_mounts_next_to_django_as_its_docs_say(
    django_site: SimpleNamespace,
) -> None:
    """docs/dashboard.md: one Starlette router, the dashboard under
    /conveyor and Django's own application for every other path."""
    from django.core.asgi import get_asgi_application
    from starlette.applications import Starlette
    from starlette.routing import Mount
    from starlette.testclient import TestClient

    from conveyor.dashboard import create_app

    queue = django_site.tasks.queue
    application = Starlette(
        routes=[
            Mount("/conveyor", app=create_app(queue, allowed_hosts=["testserver"])),
            Mount("/", app=get_asgi_application()),
        ]
    )
    with TestClient(application) as client:
        signup = client.post("/signups/", data={"email": "grace@example.com"})
        assert signup.status_code == 201, signup.text
        task_id = signup.json()["task"]
        page = client.get(f"/conveyor/tasks/{task_id}")
        assert page.status_code == 200 and "send_welcome" in page.text
        assert 'href="http://testserver/conveyor/queues"' in page.text
