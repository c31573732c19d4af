"""The pytest plugin, as a user meets it: loaded by pytest through its
``pytest11`` entry point (no conftest names it), with the fixtures used
from the user's own test files, sync and async."""

from __future__ import annotations

import textwrap
from importlib.metadata import entry_points

import pytest

pytest_plugins = ["pytester"]

QUIET = ("-p", "no:cacheprovider", "-p", "no:hypothesispytest", "-p", "no:benchmark")
"""Plugins the user's runs below do without (they only slow them down)."""

TASKS = """
    import os

    import conveyor

    # Made at import time, on the store the environment names; the tests
    # below never set it: the plugin moves the app to a memory store.
    app = conveyor.App(os.environ.get("MYPROJECT_URL", "sqlite:///production.db"))
    SENT = []
    TRIES = []


    @app.task
    def send_welcome(to: str, subject: str = "welcome") -> None:
        SENT.append(to)


    @app.task(retry=conveyor.RetryPolicy(max_attempts=3, initial_interval=600))
    def flaky() -> str:
        TRIES.append(1)
        if len(TRIES) == 1:
            raise ValueError("first try fails")
        return "ok"


    def signup(email: str) -> None:
        send_welcome.enqueue(to=email)
"""

USER_TESTS = """
    import time

    import pytest

    import conveyor
    import myproject_tasks as tasks


    def test_sync(conveyor_app):
        assert conveyor_app is tasks.app
        assert conveyor_app.url.startswith("memory://")
        tasks.signup("ada@example.com")
        conveyor.testing.assert_enqueued(tasks.send_welcome, to="ada@example.com")
        assert conveyor.testing.drain(conveyor_app) == 1
        assert tasks.SENT == ["ada@example.com"]


    async def test_async(conveyor_app):
        assert conveyor_app.list_tasks() == []  # a fresh store for each test
        await tasks.send_welcome.enqueue_async(to="bob@example.com")
        assert await conveyor.testing.drain_async(conveyor_app) == 1
        assert tasks.SENT[-1] == "bob@example.com"


    def test_clock(conveyor_app, conveyor_clock):
        started = time.monotonic()
        later = tasks.send_welcome.options(delay=3600).enqueue(to="later@example.com")
        assert conveyor.testing.drain(conveyor_app) == 0
        conveyor_clock.advance(3600)
        assert conveyor.testing.drain(conveyor_app) == 1
        assert conveyor_app.get(later.id).state is conveyor.TaskState.SUCCEEDED

        retried = tasks.flaky.enqueue()
        assert conveyor.testing.drain(conveyor_app) == 1  # fails, back-off of 600 s
        conveyor_clock.advance(700)
        assert conveyor.testing.drain(conveyor_app) == 1
        assert retried.result(timeout=5) == "ok"
        assert time.monotonic() - started < 30  # not an hour


    @pytest.mark.conveyor_inline
    async def test_inline(conveyor_app):
        handle = await tasks.send_welcome.enqueue_async(to="now@example.com")
        task = await conveyor_app.get_async(handle.id)
        assert task.state is conveyor.TaskState.SUCCEEDED


    def test_assert_enqueued_fails_with_what_was_enqueued(conveyor_app):
        tasks.signup("eve@example.com")
        conveyor.testing.assert_enqueued(tasks.send_welcome, to="mallory@example.com")


    @pytest.mark.timeout(20)
    def test_freezegun(conveyor_app):
        from freezegun import freeze_time

        with freeze_time("2030-01-01"):
            tasks.signup("frozen@example.com")
            with pytest.raises(conveyor.ConfigurationError, match="conveyor_clock"):
                conveyor.testing.drain(conveyor_app)


    def test_zz_the_app_is_back_on_its_own_store():
        assert tasks.app.url == "sqlite:///production.db"
"""


@pytest.fixture
def project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """A user's project: a module of tasks and pytest configured to find it."""
    monkeypatch.delenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    monkeypatch.delenv("MYPROJECT_URL", raising=False)
    pytester.makepyfile(myproject_tasks=textwrap.dedent(TASKS))
    pytester.makeini(
        """
        [pytest]
        asyncio_mode = auto
        asyncio_default_fixture_loop_scope = function
        pythonpath = .
        filterwarnings = error
        conveyor_app = myproject_tasks:app
        """
    )
    return pytester


def test_the_plugin_is_registered_as_a_pytest11_entry_point() -> None:
    found = [e for e in entry_points(group="pytest11") if e.name == "conveyor"]
    assert [e.value for e in found] == ["conveyor.testing.plugin"]


@pytest.mark.timeout(120)
def test_the_fixtures_work_in_a_user_s_own_test_file(project: pytest.Pytester) -> None:
    project.makepyfile(test_user=textwrap.dedent(USER_TESTS))
    result = project.runpytest_subprocess(*QUIET)
    result.assert_outcomes(passed=6, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*no pending task 'send_welcome' with to='mallory@example.com'",
            "*pending tasks of 'send_welcome' (1):",
            "*  #1 {'to': 'eve@example.com'} (run_at *)",
        ]
    )
    assert not (project.path / "production.db").exists()  # the real store was never opened


def test_a_conveyor_app_fixture_of_the_user_s_own_is_swapped_too(
    project: pytest.Pytester,
) -> None:
    project.makeconftest(
        """
        import pytest

        import myproject_tasks


        @pytest.fixture
        def conveyor_app():
            return myproject_tasks.app


        @pytest.fixture
        def signed_up(conveyor_app):
            myproject_tasks.signup("ada@example.com")  # after the swap
        """
    )
    project.makepyfile(
        test_override="""
        import conveyor
        import myproject_tasks


        def test_override(signed_up, conveyor_app):
            assert conveyor_app.url.startswith("memory://")
            conveyor.testing.assert_enqueued(myproject_tasks.send_welcome)


        def test_other_tests_are_left_alone():
            assert myproject_tasks.app.url == "sqlite:///production.db"
        """
    )
    project.makeini(
        """
        [pytest]
        asyncio_default_fixture_loop_scope = function
        pythonpath = .
        filterwarnings = error
        """
    )
    result = project.runpytest(*QUIET)
    result.assert_outcomes(passed=2)


def test_without_an_app_the_fixture_says_how_to_name_one(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    pytester.makepyfile(
        """
        def test_needs_app(conveyor_app):
            pass
        """
    )
    result = pytester.runpytest(*QUIET)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        ["*the conveyor_app fixture needs your App: set `conveyor_app = myproject.tasks:app`*"]
    )
