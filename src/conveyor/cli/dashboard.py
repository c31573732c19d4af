"""``conveyor dashboard``: the web dashboard (the ``dashboard`` extra),
served by uvicorn.

It binds 127.0.0.1 by default, and asks for a way in: ``--token`` (or
``CONVEYOR_DASHBOARD_TOKEN``), ``--basic USER:PASSWORD`` (or
``CONVEYOR_DASHBOARD_BASIC``), or ``--no-auth`` to let in whoever reaches
the port (for a dashboard on a laptop). ``--read-only`` shows no action.
"""

from __future__ import annotations

import click

from conveyor.cli.common import backend_options, check_store, fail, open_client
from conveyor.errors import ConfigurationError, ConveyorError


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
    "to /?token=TOKEN, which sets a cookie.",
)
@click.option(
    "--basic",
    envvar="CONVEYOR_DASHBOARD_BASIC",
    metavar="USER:PASSWORD",
    help="HTTP basic authentication with this user and password.",
)
@click.option("--no-auth", is_flag=True, help="Let in every request (local use only).")
@click.option("--read-only", is_flag=True, help="Show no action; refuse every POST.")
@backend_options
def dashboard(
    url: str | None,
    schema: str | None,
    port: int,
    host: str,
    token: str | None,
    basic: str | None,
    no_auth: bool,
    read_only: bool,
) -> None:
    """Serve the web dashboard (the dashboard extra): queues, tasks with
    their attempts, failed tasks, workers, schedules, and /metrics."""
    if sum((token is not None, basic is not None, no_auth)) != 1:
        raise click.UsageError("give exactly one of --token, --basic USER:PASSWORD or --no-auth")
    try:
        import uvicorn

        from conveyor.dashboard import Auth, basic_auth, create_app, token_auth
    except ImportError as exc:
        fail(ConfigurationError(f"{exc}: install the extra: pip install 'conveyor[dashboard]'"))
    auth: Auth | None
    if basic is not None:
        user, colon, password = basic.partition(":")
        if not colon or not user or not password:
            raise click.BadParameter("expected USER:PASSWORD", param_hint="--basic")
        auth = basic_auth(user, password)
    elif token is not None:
        if not token:
            raise click.BadParameter("the token must not be empty", param_hint="--token")
        auth = token_auth(token)
    else:
        auth = None
    try:
        app = open_client(url, schema)
        check_store(app)  # a missing store is refused here, not page by page
        web = create_app(app, auth=auth, read_only=read_only)
        click.echo(f"dashboard of {app.location} on http://{host}:{port}/", err=True)
        uvicorn.run(web, host=host, port=port, log_level="warning")
    except ConveyorError as exc:
        fail(exc)
