"""Registration and payload binding, checked before any I/O."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import conveyor
from conveyor import TaskContext

URL = "postgresql://127.0.0.1:5432/test"


@pytest.fixture
def offline_app() -> conveyor.App:
    return conveyor.App(URL)  # nothing connects until a backend is used


def test_payload_keys_must_match_the_handler(offline_app: conveyor.App) -> None:
    @offline_app.task()
    def send(ctx: TaskContext, to: str, subject: str = "hi") -> None:
        return None

    assert send.encode_args({"to": "a"}, 1000) == '{"to":"a"}'
    with pytest.raises(conveyor.PayloadError, match="missing a required argument: to"):
        send.encode_args({"subject": "x"}, 1000)
    with pytest.raises(conveyor.PayloadError, match="unexpected argument: cc"):
        send.encode_args({"to": "a", "cc": "b"}, 1000)
    with pytest.raises(conveyor.PayloadError, match="context"):
        send.encode_args({"to": "a", "ctx": 1}, 1000)


def test_var_keyword_handlers_take_any_keys(offline_app: conveyor.App) -> None:
    @offline_app.task()
    def anything(**fields: Any) -> None:
        return None

    assert anything.encode_args({"x": 1, "y": [2]}, 1000) == '{"x":1,"y":[2]}'


def test_positional_only_parameters_are_refused_at_registration(
    offline_app: conveyor.App,
) -> None:
    def positional(a: int, /) -> None:
        return None

    with pytest.raises(conveyor.ConfigurationError, match="positional-only"):
        offline_app.task(positional)


def test_executor_follows_the_handler_kind(offline_app: conveyor.App) -> None:
    @offline_app.task()
    async def coro() -> None:
        return None

    @offline_app.task()
    def plain() -> None:
        return None

    @offline_app.task(process=True)
    def cpu() -> None:
        return None

    assert (coro.executor, plain.executor, cpu.executor) == ("async", "thread", "process")
    with pytest.raises(conveyor.ConfigurationError, match="TaskContext"):
        offline_app.task(name="ctx_in_process", process=True)(_takes_context)


def _takes_context(ctx: TaskContext) -> None:
    return None


def test_invalid_options_are_refused(offline_app: conveyor.App) -> None:
    with pytest.raises(conveyor.ConfigurationError):
        offline_app.task(name="a", lease=0.1)(_takes_context)
    with pytest.raises(conveyor.ConfigurationError):
        offline_app.task(name="b", queue="")(_takes_context)
    with pytest.raises(conveyor.ConfigurationError):
        offline_app.task(name="c", priority=2**40)(_takes_context)


def test_delay_and_run_at_are_exclusive_and_run_at_is_aware(offline_app: conveyor.App) -> None:
    from datetime import datetime

    @offline_app.task()
    def noop() -> None:
        return None

    with pytest.raises(conveyor.ConfigurationError, match="not both"):
        noop.options(delay=1, run_at=datetime.now().astimezone())
    with pytest.raises(conveyor.ConfigurationError, match="timezone"):
        noop.options(run_at=datetime(2030, 1, 1))
    with pytest.raises(conveyor.ConfigurationError):
        noop.options(delay=-1)


def test_unknown_url_schemes_and_empty_urls_are_configuration_errors() -> None:
    with pytest.raises(conveyor.ConfigurationError, match="scheme"):
        conveyor.App("mysql://x")
    with pytest.raises(conveyor.ConfigurationError, match="empty"):
        conveyor.App("")
    with pytest.raises(conveyor.ConfigurationError, match="file path"):
        conveyor.App("sqlite:///:memory:")
    with pytest.raises(conveyor.ConfigurationError, match="SQLite URL"):
        conveyor.App("sqlite://host/x.db")
    with pytest.raises(conveyor.ConfigurationError, match="unknown SQLite URL option"):
        conveyor.App("sqlite:///x.db?journal=off")
    with pytest.raises(conveyor.ConfigurationError, match="synchronous"):
        conveyor.App("sqlite:///x.db?synchronous=off").make_backend()


def test_without_a_url_the_app_uses_sqlite_in_the_working_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("CONVEYOR_URL", raising=False)
    monkeypatch.chdir(tmp_path)
    app = conveyor.App()

    @app.task
    def noop() -> None:
        return None

    assert app.url == "sqlite:///conveyor.db"
    handle = noop.enqueue()
    assert app.get(handle.id) is not None
    app.close()
    assert (tmp_path / "conveyor.db").exists()


def test_enqueue_chunks_start_small_and_grow_to_the_cap() -> None:
    """The first chunk is what the server waits for: it is small; the next
    ones double up to the cap; together they cover every task once, in order."""
    import itertools

    from conveyor.client import ENQUEUE_CHUNK, ENQUEUE_FIRST_CHUNK, chunk_bounds

    total = ENQUEUE_CHUNK * 3 + 7
    bounds = list(chunk_bounds(total))
    sizes = [end - start for start, end in bounds]
    assert sizes[0] == ENQUEUE_FIRST_CHUNK < ENQUEUE_CHUNK
    assert all(b == min(a * 2, ENQUEUE_CHUNK) for a, b in itertools.pairwise(sizes[:-1]))
    assert max(sizes) == ENQUEUE_CHUNK
    assert [start for start, _ in bounds] == [0] + [end for _, end in bounds[:-1]]
    assert bounds[-1][1] == total
    assert list(chunk_bounds(0)) == []
    assert list(chunk_bounds(3)) == [(0, 3)]
