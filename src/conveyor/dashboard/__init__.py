"""A web dashboard of a conveyor store (the ``dashboard`` extra:
``pip install 'conveyor[dashboard]'``).

:func:`create_app` gives an ASGI application (Starlette) to mount in a web
application or to serve alone (``conveyor dashboard``): queues, tasks with
their attempts and explanation, failed tasks, workers, schedules, the
last hour's activity, and the store's Prometheus gauges on ``/metrics``.
See ``docs/dashboard.md``.
"""

from __future__ import annotations

from conveyor.dashboard.app import create_app
from conveyor.dashboard.security import Auth, BasicAuth, TokenAuth, basic_auth, token_auth

__all__ = ["Auth", "BasicAuth", "TokenAuth", "basic_auth", "create_app", "token_auth"]
