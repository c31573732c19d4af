"""A web dashboard of a conveyor store (the ``dashboard`` extra:
``pip install 'conveyor[dashboard]'``).

:func:`create_app` gives an ASGI application (Starlette) to mount in a web
application or to serve alone (``conveyor dashboard``): queues, tasks with
their attempts and explanation, failed tasks, workers, schedules, the
last hour's activity, and the store's Prometheus gauges on ``/metrics``.
See ``docs/dashboard.md``.
"""

from __future__ import annotations

from conveyor.errors import ConfigurationError

try:
    import jinja2  # noqa: F401
    import starlette  # noqa: F401
except ModuleNotFoundError as exc:  # pragma: no cover - exercised without the extra
    raise ConfigurationError(
        f"the dashboard needs {exc.name}: pip install 'conveyor[dashboard]'"
    ) from None

from conveyor.dashboard.app import create_app
from conveyor.dashboard.security import (
    Auth,
    BasicAuth,
    TokenAuth,
    basic_auth,
    token_auth,
)

__all__ = ["Auth", "BasicAuth", "TokenAuth", "basic_auth", "create_app", "token_auth"]
