"""Arguments the real ``conveyor`` command refuses with one line and an exit
code, never a traceback: JSON nested too deeply, a duration past the year 1,
a URL that does not parse, a run time no store holds, a name that breaks the
name rule. The refusals come before any I/O: nothing is stored."""

from __future__ import annotations

import pytest

from tests.cli_harness import Cli
from tests.conftest import CLI_ON_REDIS

DEEP = "[" * 10_000 + "]" * 10_000


def refused(cli: Cli, *args: str, code: int = 1) -> str:
    """The one line of a command that must fail with ``code``."""
    done = cli.run(*args)
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.returncode == code, (done.returncode, done.stderr[-500:])
    assert done.stdout == ""
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("error: ")
    assert len(line) < 400, line
    return line


def nothing_stored(cli: Cli) -> None:
    assert cli.json("tasks") == []


@CLI_ON_REDIS
def test_args_nested_10000_deep_is_one_line(cli: Cli) -> None:
    line = refused(cli, "enqueue", "job", "--args", '{"a": ' + DEEP + "}")
    assert "--args is nested too deeply" in line
    line = refused(cli, "enqueue", "job", "--args", '{"a": ' + "[" * 500 + "]" * 500 + "}")
    assert "nesting is deeper" in line
    assert "MESSAGE is nested too deeply" in refused(cli, "send", "1", DEEP)
    nothing_stored(cli)


def test_a_since_before_the_year_1_is_one_line(cli: Cli) -> None:
    for since in ("99999999999d", "9" * 400 + "d"):
        for command in ("retry", "cancel"):
            line = refused(cli, command, "--since", since)
            assert "--since reaches back before the year 1" in line
    assert "Retention.succeeded" in refused(cli, "prune", "--succeeded", "99999999999d")


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://[::1/db",
        "postgresql://user:secret@[::1/db",
        "redis://[::1",
        "redis://127.0.0.1:99999/0",
        "sqlite:///[broken",
    ],
)
def test_a_url_that_does_not_parse_is_one_line(url: str) -> None:
    cli = Cli(url, "conveyor")
    for command in (("tasks",), ("enqueue", "job"), ("retry", "--state", "failed")):
        done = cli.run(*command, "--url", url)
        assert "Traceback" not in done.stderr, done.stderr[-2000:]
        assert done.returncode in (1, 2), done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
        assert "secret" not in done.stderr


@CLI_ON_REDIS
@pytest.mark.parametrize("run_at", ["0001-01-01T00:00:00", "9999-12-31T00:00:00"])
def test_a_run_time_no_store_holds_is_refused_before_any_io(cli: Cli, run_at: str) -> None:
    line = refused(cli, "enqueue", "job", "--run-at", run_at)
    assert "run_at must be from 0001-01-02 to 9999-12-30 UTC" in line
    assert "DETAIL" not in line and "Failing row" not in line
    cli.enqueue("job", {}, "--run-at", "0001-01-02T00:00:00")
    cli.enqueue("job", {}, "--run-at", "9999-12-29T00:00:00")


@CLI_ON_REDIS
@pytest.mark.parametrize("queue", ["q" * 10_000, "a\nb", "a\tb"], ids=["10kb", "newline", "tab"])
def test_a_bad_queue_is_one_line_and_stores_nothing(cli: Cli, queue: str) -> None:
    line = refused(cli, "enqueue", "job", "--queue", queue)
    assert "queue must be 1 to 200 printable characters" in line
    assert "insert" not in line.lower() and "function" not in line.lower()
    for command in ("tasks", "retry", "cancel"):
        assert "printable characters" in refused(cli, command, "--queue", queue)
    assert "printable characters" in refused(cli, "tasks", "--name", queue)
    assert "printable characters" in refused(cli, "pause", "--queue", queue)
    nothing_stored(cli)


def test_a_worker_refuses_a_bad_queue_to_serve(cli: Cli) -> None:
    line = refused(cli, "worker", "tests.apps.cli_app:app", "--burst", "-q", "mail,a\nb")
    assert "a worker's queue must be 1 to 200 printable characters" in line


def test_a_negative_delay_is_a_usage_error(cli: Cli) -> None:
    assert "--delay" in cli.usage_error("enqueue", "job", "--delay", "-1")
