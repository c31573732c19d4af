"""The ``conveyor`` command: rich output for people, ``--json`` for scripts.

Commands: ``migrate`` (``--sql`` to review first), ``worker``, ``enqueue``,
``send``, ``tasks``, ``counts``, ``show``, ``explain``, ``graph``, ``workers``, ``cancel``,
``retry`` (by id or by filter, ``--dry-run``), ``run-now``, ``delete``,
``pause``, ``resume``,
``pauses``, ``keys``, ``schedules``, ``prune``, ``health``, ``top``, ``exporter``,
``dashboard`` and ``demo``.
Every command takes ``--url`` (default ``CONVEYOR_URL``) and ``--schema``
(default ``CONVEYOR_SCHEMA``, then ``conveyor``); ``worker`` (and
``enqueue --app``) use the app's own store unless ``--url``/``--schema``
are given. Only ``migrate``, ``worker`` (unless ``--no-migrate``) and
``demo`` create or upgrade a store; the others refuse one that is not
there (a SQLite file, a PostgreSQL schema, a Redis key prefix) or is
behind, and never run DDL. Errors are one line on stderr: exit code 1 for
a failed operation, 2 for a store that cannot be reached or is not there,
or a malformed command line. What a store holds is printed as text, its
control characters escaped (:mod:`conveyor.cli.text`).
"""

from __future__ import annotations

import logging

import click

from conveyor.cli.control import cancel, delete, enqueue, retry, run_now, send
from conveyor.cli.dashboard import dashboard
from conveyor.cli.exporter import exporter
from conveyor.cli.flow import keys, pause, pauses, prune, resume, schedules
from conveyor.cli.graph import graph
from conveyor.cli.reads import counts, explain, health, show, tasks, workers
from conveyor.cli.serve import demo, migrate, worker
from conveyor.cli.top import top


@click.group()
@click.version_option(package_name="conveyor")
def main() -> None:
    """conveyor: a durable task system."""


for command in (migrate, worker, enqueue, send, tasks, counts, show, cancel, retry, workers):
    main.add_command(command)
main.add_command(health)
main.add_command(explain)
main.add_command(graph)
main.add_command(top)
main.add_command(exporter)
main.add_command(dashboard)
for command in (run_now, delete, pause, resume, pauses, keys, schedules, prune):
    main.add_command(command)
main.add_command(demo)

logging.getLogger("conveyor").addHandler(logging.NullHandler())

__all__ = ["main"]
