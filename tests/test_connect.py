"""A store that cannot be reached fails fast, in one line that names the cause."""

from __future__ import annotations

import uuid
from urllib.parse import urlsplit, urlunsplit

import pytest

import conveyor
from conveyor.backends.postgres.urls import DEFAULT_CONNECT_TIMEOUT, connect_timeout
from conveyor.redaction import redact_url
from tests.cli_harness import Cli
from tests.conftest import PG_URL
from tools.proxy import Proxy

EXIT_UNAVAILABLE = 2


def _with(url: str, *, port: int | None = None, database: str | None = None) -> str:
    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    netloc = f"root:secret@{host}:{port if port is not None else parts.port or 5432}"
    path = f"/{database}" if database is not None else parts.path
    return urlunsplit(parts._replace(netloc=netloc, path=path))


def _unavailable(cli: Cli, *args: str) -> str:
    """Run a command that cannot reach its store: exit 2, one line, no password.
    The subprocess timeout (20 s) is far above the connect timeout and below
    the 30 s a pool used to wait before it said anything."""
    done = cli.run(*args, timeout=20)
    assert done.returncode == EXIT_UNAVAILABLE, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, f"expected a one-line error, got {done.stderr!r}"
    assert lines[0].startswith("error: cannot connect to postgresql://root:***@")
    assert "secret" not in done.stderr
    return lines[0]


def test_a_refused_connection_is_one_line_with_exit_code_2(pg_url: str) -> None:
    cli = Cli(_with(pg_url, port=1), "conveyor")
    for command in (("tasks",), ("enqueue", "job"), ("show", "1"), ("workers",), ("counts",)):
        assert "refused" in _unavailable(cli, *command).lower()


def test_a_missing_database_is_named(pg_url: str) -> None:
    missing = f"conveyor_missing_{uuid.uuid4().hex[:8]}"
    line = _unavailable(Cli(_with(pg_url, database=missing), "conveyor"), "tasks")
    assert f'"{missing}" does not exist' in line


def test_a_server_that_never_answers_fails_after_the_connect_timeout(pg_url: str) -> None:
    with Proxy(pg_url) as proxy:
        proxy.blackhole()
        parts = urlsplit(proxy.url)
        url = urlunsplit(parts._replace(netloc=f"root:secret@{parts.netloc.rpartition('@')[2]}"))
        line = _unavailable(Cli(f"{url}?connect_timeout=2", "conveyor"), "tasks")
    assert "timeout" in line.lower()


def test_the_api_raises_backend_unavailable_with_the_cause(pg_url: str) -> None:
    app = conveyor.App(_with(pg_url, port=1))
    try:
        with pytest.raises(conveyor.BackendUnavailableError, match="refused") as caught:
            app.list_tasks()
        assert "secret" not in str(caught.value)
        assert isinstance(caught.value, conveyor.BackendError)
    finally:
        app.close()


def test_connect_timeouts_come_from_the_url() -> None:
    assert connect_timeout("postgresql://h/db") == DEFAULT_CONNECT_TIMEOUT
    assert connect_timeout("postgresql://h/db?connect_timeout=10") == 10
    assert connect_timeout("postgresql://h/db?connect_timeout=1") == 2  # libpq's floor
    for bad in ("soon", "0", "-3"):
        with pytest.raises(conveyor.ConfigurationError, match="connect_timeout"):
            connect_timeout(f"postgresql://h/db?connect_timeout={bad}")


def test_urls_are_shown_without_their_password() -> None:
    assert redact_url("postgresql://ada:pw@db:5432/x?sslmode=require") == (
        "postgresql://ada:***@db:5432/x?sslmode=require"
    )
    assert redact_url("postgresql://ada@db/x") == "postgresql://ada@db/x"
    assert redact_url("postgresql://:pw@db/x") == "postgresql://:***@db/x"


SOCKET_DIR = "/var/run/postgresql"


@pytest.mark.parametrize(
    "url",
    [
        "postgresql:///test",  # libpq's default socket directory
        f"postgresql:///test?host={SOCKET_DIR}",
        "postgresql://%2Fvar%2Frun%2Fpostgresql/test",
        f"postgres://root@/test?host={SOCKET_DIR}&connect_timeout=3",
    ],
)
async def test_unix_socket_urls_reach_the_server(url: str, schema: str) -> None:
    # An empty host (the unix socket) once lost the "//" of its URL when the
    # schema parameter was taken out: "postgresql:/test", which libpq refuses.
    app = conveyor.App(f"{url}{'&' if '?' in url else '?'}schema={schema}")

    @app.task()
    async def double(n: int) -> int:
        return 2 * n

    try:
        handle = await double.enqueue_async(n=21)
        await conveyor.testing.drain_async(app)
        assert await handle.result_async(timeout=5) == 42
        backend = await app.backend()
        assert getattr(backend, "schema", None) == schema
        assert "schema=" not in str(getattr(backend, "url", ""))
    finally:
        await app.aclose()


def test_only_the_named_query_items_are_taken_out_and_the_rest_kept_as_written() -> None:
    from conveyor.backends.urlquery import without

    assert without("postgresql:///db?schema=x&sslmode=", ("schema",)) == (
        "postgresql:///db?sslmode=",
        {"schema": "x"},
    )
    only = without("postgresql:///db?schema=x", ("schema",))
    assert only == ("postgresql:///db", {"schema": "x"})
    assert without("redis:///0?prefix=p&a=b+c#frag", ("prefix",)) == (
        "redis:///0?a=b+c#frag",
        {"prefix": "p"},
    )
    assert without("postgresql://u:p%40@h:1/db", ("schema",)) == ("postgresql://u:p%40@h:1/db", {})
    # libpq does not decode "+": a space must stay %20 for it.
    spaced = "postgresql:///db?options=-c%20statement_timeout%3D5s&schema=s"
    assert without(spaced, ("schema",))[0] == "postgresql:///db?options=-c%20statement_timeout%3D5s"


async def test_libpq_options_in_the_url_reach_the_server() -> None:
    """A URL's ``options`` (spaces written %20) survives ``schema`` being
    taken out: the server runs with the setting it names."""
    query = "options=-c%20statement_timeout%3D4321&schema=public"
    url = f"{PG_URL}{'&' if '?' in PG_URL else '?'}{query}"
    backend = conveyor.backends.backend_from_url(url)
    await backend.open()
    try:
        with backend.sync_pool.connection() as conn:  # type: ignore[attr-defined]
            found = conn.execute("show statement_timeout").fetchone()
        assert found == ("4321ms",)
    finally:
        await backend.close()
