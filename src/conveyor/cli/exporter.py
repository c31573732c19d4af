"""``conveyor exporter``: the store's own Prometheus gauges on one port.

Every ``--interval`` seconds it reads the store (:class:`~conveyor.metrics.StoreMetrics`:
tasks by state and queue, due and later tasks and the oldest due task's age
per queue, live workers and their slots) and serves the last reading on
``/metrics``. A read that fails sets ``conveyor_store_up`` to 0, logs a
warning and keeps the last values; the next interval tries again.
"""

from __future__ import annotations

import asyncio
import logging

import click

from conveyor.app import App
from conveyor.backends.capabilities import capability_of
from conveyor.backends.protocol import Capability
from conveyor.cli.common import backend_options, fail, open_client
from conveyor.errors import ConfigurationError, ConveyorError
from conveyor.logs import configure_logging
from conveyor.worker.texts import reason

log = logging.getLogger("conveyor.exporter")


async def _export(app: App, port: int, addr: str, interval: float) -> None:
    from conveyor.metrics import StoreMetrics  # the metrics extra: imported only when asked

    metrics = StoreMetrics()
    async with app:
        backend = await app.backend()
        inspector = capability_of(backend, Capability.INSPECT)
        if inspector is None:
            raise ConfigurationError(f"the {type(backend).__name__} has no read side to export")
        metrics.serve(port, addr)
        log.info("store metrics of %s on http://%s:%d/metrics", app.location, addr, port)
        while True:
            try:
                await metrics.refresh(backend, inspector)
            except Exception as exc:  # a store away for a while: say so, keep serving
                metrics.up.set(0)
                log.warning("cannot read the store: %s", reason(exc))
            await asyncio.sleep(interval)


@click.command()
@click.option("--port", type=click.IntRange(min=0, max=65535), default=9109, show_default=True)
@click.option(
    "--addr",
    default="0.0.0.0",  # noqa: S104 - a scrape target, reached from the Prometheus server
    show_default=True,
    help="The address to listen on (every interface by default: counts, no payloads).",
)
@click.option(
    "--interval",
    type=click.FloatRange(min=0.5),
    default=15.0,
    show_default=True,
    help="Seconds between two reads of the store.",
)
@backend_options
def exporter(url: str | None, schema: str | None, port: int, addr: str, interval: float) -> None:
    """Serve the store's own Prometheus gauges (the metrics extra): tasks by
    state and queue, due tasks and the oldest due task's age per queue,
    live workers. One scrape sees the whole system."""
    configure_logging("text", "INFO")
    try:
        asyncio.run(_export(open_client(url, schema), port, addr, interval))
    except ConveyorError as exc:
        fail(exc)
    except KeyboardInterrupt:
        pass
