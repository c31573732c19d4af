"""conveyor's pytest plugin, loaded by pytest through the ``pytest11`` entry
point once conveyor is installed (nothing to add to ``conftest.py``).

Fixtures:

- ``conveyor_app``: your App, on a fresh, empty memory store for the
  test (then back on its own store). Name it in your pytest configuration
  (``conveyor_app = myproject.tasks:app``), or override the fixture::

      @pytest.fixture
      def conveyor_app():
          return myproject.tasks.app

  Whichever way, the plugin swaps the app's store around each test that
  uses the fixture (directly or through another fixture), sync or async.
- ``conveyor_clock``: a :class:`~conveyor.testing.FakeClock`. In a test
  that also uses ``conveyor_app``, the app's memory store takes its time
  from it; elsewhere bind it yourself with
  ``conveyor.testing.in_memory(app, clock=conveyor_clock)``.

Inline mode (every enqueue runs its tasks before returning) for one test:
``@pytest.mark.conveyor_inline``; for all: ``conveyor_inline = true`` in the
configuration.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator

import pytest

from conveyor.app import App
from conveyor.testing.clock import FakeClock
from conveyor.testing.isolation import in_memory

APP_OPTION = "conveyor_app"
INLINE_OPTION = "conveyor_inline"
INLINE_MARKER = "conveyor_inline"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        APP_OPTION,
        "the App the conveyor_app fixture gives, as module:attribute (e.g. myproject.tasks:app)",
        default="",
    )
    parser.addini(
        INLINE_OPTION,
        "run the tasks of conveyor_app at enqueue in every test (inline mode)",
        type="bool",
        default=False,
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{INLINE_MARKER}: the conveyor_app fixture runs tasks at enqueue (inline mode)",
    )


@pytest.fixture
def conveyor_app(request: pytest.FixtureRequest) -> App:
    """Your App, on a fresh memory store for this test: the one named by the
    ``conveyor_app`` configuration option (``module:attribute``). Override
    this fixture to give it otherwise; the store is swapped either way."""
    spec = str(request.config.getini(APP_OPTION) or "")
    if not spec:
        pytest.fail(
            "the conveyor_app fixture needs your App: set `conveyor_app = "
            "myproject.tasks:app` in your pytest configuration, or define a "
            "`conveyor_app` fixture that returns it",
            pytrace=False,
        )
    return load_app(spec)


@pytest.fixture
def conveyor_clock() -> FakeClock:
    """A fake clock, starting now; the store of ``conveyor_app`` follows it
    when the test uses both (see :class:`~conveyor.testing.FakeClock`)."""
    return FakeClock()


@pytest.fixture(autouse=True)
def _conveyor_memory_store(request: pytest.FixtureRequest) -> Iterator[None]:
    """Swap the store of ``conveyor_app`` for a fresh memory one around each
    test that uses it; other tests are left alone."""
    if APP_OPTION not in request.fixturenames:
        yield
        return
    app = request.getfixturevalue(APP_OPTION)
    if not isinstance(app, App):
        pytest.fail(
            f"the conveyor_app fixture must give a conveyor.App, not {app!r}", pytrace=False
        )
    clock = None
    if "conveyor_clock" in request.fixturenames:
        clock = request.getfixturevalue("conveyor_clock")
    inline = bool(request.config.getini(INLINE_OPTION)) or (
        request.node.get_closest_marker(INLINE_MARKER) is not None
    )
    with in_memory(app, clock=clock, inline=inline):
        yield


def load_app(spec: str) -> App:
    """The App at ``module:attribute`` (the attribute may be dotted)."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        pytest.fail(f"conveyor_app must read module:attribute, not {spec!r}", pytrace=False)
    try:
        found: object = importlib.import_module(module_name)
        for part in attribute.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as exc:
        pytest.fail(f"conveyor_app {spec!r} cannot be loaded: {exc}", pytrace=False)
    if not isinstance(found, App):
        pytest.fail(f"conveyor_app {spec!r} is {found!r}, not a conveyor.App", pytrace=False)
    return found
