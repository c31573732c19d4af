"""``conveyor dashboard``: the web dashboard (the ``dashboard`` extra),
served by uvicorn.

It binds 127.0.0.1 by default, and asks for a way in: a token
(``CONVEYOR_DASHBOARD_TOKEN``, ``--token-file`` or ``--token``), basic
authentication (``CONVEYOR_DASHBOARD_BASIC``, ``--basic-file`` or
``--basic USER:PASSWORD``), or ``--no-auth`` to let in whoever reaches the
port (for a dashboard on a laptop). A secret given on the command line is
in the process list for every user of the machine to read: the environment
variables and the files are preferred. ``--read-only`` shows no action.

It answers only the host names it is known by (against DNS rebinding):
this machine's (``localhost``, ``127.0.0.1``, ``[::1]``) when it binds a
loopback address or runs with ``--no-auth``, and those given by
``--allowed-host``; bound to another address with a way in and no
``--allowed-host``, it answers any name (a rebound page carries no
credential).
"""

from __future__ import annotations

import ipaddress
from pathlib import Path

import click

from conveyor.cli.common import backend_options, check_store, fail, open_client
from conveyor.errors import ConfigurationError, ConveyorError

PREFER_FILES = "Prefer the environment variable or the file: a value here is in the process list."


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host.lower() == "localhost"


def _read_secret(path: Path | None, option: str) -> str | None:
    """The first line of the file at ``path`` (its end of line dropped)."""
    if path is None:
        return None
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise click.BadParameter(f"cannot read {path}: {exc}", param_hint=option) from None
    return lines[0] if lines else ""


@click.command()
@click.option("--port", type=click.IntRange(min=0, max=65535), default=8080, show_default=True)
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="The address to listen on (only this machine by default).",
)
@click.option(
    "--token",
    envvar="CONVEYOR_DASHBOARD_TOKEN",
    help="Let in requests that carry it: 'Authorization: Bearer TOKEN', or a first visit "
    f"to /?token=TOKEN, which sets a cookie (12 hours). {PREFER_FILES}",
)
@click.option(
    "--token-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Read the token from the first line of this file.",
)
@click.option(
    "--basic",
    envvar="CONVEYOR_DASHBOARD_BASIC",
    metavar="USER:PASSWORD",
    help=f"HTTP basic authentication with this user and password. {PREFER_FILES}",
)
@click.option(
    "--basic-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Read USER:PASSWORD for basic authentication from the first line of this file.",
)
@click.option("--no-auth", is_flag=True, help="Let in every request (local use only).")
@click.option(
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    metavar="NAME",
    help="Also answer requests for this host name (repeatable; this machine's names are "
    "answered when bound to a loopback address or with --no-auth).",
)
@click.option("--read-only", is_flag=True, help="Show no action; refuse every POST.")
@backend_options
def dashboard(
    url: str | None,
    schema: str | None,
    port: int,
    host: str,
    token: str | None,
    token_file: Path | None,
    basic: str | None,
    basic_file: Path | None,
    no_auth: bool,
    allowed_hosts: tuple[str, ...],
    read_only: bool,
) -> None:
    """Serve the web dashboard (the dashboard extra): queues, tasks with
    their attempts, failed tasks, workers, schedules, and /metrics.

    Give the token in CONVEYOR_DASHBOARD_TOKEN or --token-file (basic
    credentials in CONVEYOR_DASHBOARD_BASIC or --basic-file) rather than on
    the command line, where every user of the machine can read it."""
    given = (token, token_file, basic, basic_file)
    if sum(value is not None for value in given) + no_auth != 1:
        raise click.UsageError(
            "give exactly one of --token, --token-file, --basic USER:PASSWORD, --basic-file "
            "or --no-auth"
        )
    token = _read_secret(token_file, "--token-file") if token_file else token
    basic = _read_secret(basic_file, "--basic-file") if basic_file else basic
    try:
        import uvicorn

        from conveyor.dashboard import Auth, basic_auth, create_app, token_auth
        from conveyor.dashboard.hosts import LOCAL_HOSTS
    except ImportError as exc:
        fail(ConfigurationError(f"{exc}: install the extra: pip install 'conveyor[dashboard]'"))
    auth: Auth | None
    if basic is not None:
        user, colon, password = basic.partition(":")
        if not colon or not user or not password:
            hint = "--basic-file" if basic_file else "--basic"
            raise click.BadParameter("expected USER:PASSWORD", param_hint=hint)
        auth = basic_auth(user, password)
    elif token is not None:
        if not token:
            hint = "--token-file" if token_file else "--token"
            raise click.BadParameter("the token must not be empty", param_hint=hint)
        auth = token_auth(token)
    else:
        auth = None
    hosts = list(allowed_hosts)
    if no_auth or _loopback(host):
        hosts.extend(LOCAL_HOSTS)
    try:
        app = open_client(url, schema)
        check_store(app)  # a missing store is refused here, not page by page
        web = create_app(app, auth=auth, read_only=read_only, allowed_hosts=hosts or None)
        click.echo(f"dashboard of {app.location} on http://{host}:{port}/", err=True)
        uvicorn.run(web, host=host, port=port, log_level="warning")
    except ConveyorError as exc:
        fail(exc)
