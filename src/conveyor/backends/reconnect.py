"""How a wake-up listener rides out a lost connection.

It tries again after a back-off that doubles from ``RECONNECT_MIN_DELAY``
to ``RECONNECT_MAX_DELAY`` seconds, and logs an outage once per change of
cause: a warning when it starts, info when its cause changes or it ends,
debug for each repeat. Wake-ups are hints (workers poll too), so a
listener never gives up.
"""

from __future__ import annotations

import asyncio
import logging

RECONNECT_MIN_DELAY = 0.1
RECONNECT_MAX_DELAY = 5.0


class Outage:
    """One listener's connection troubles: call :meth:`connected` after each
    (re)connect and ``await`` :meth:`lost` when the connection fails."""

    def __init__(self, log: logging.Logger) -> None:
        self.log = log
        self.delay = RECONNECT_MIN_DELAY
        self.cause: str | None = None
        """What the connection was last lost to; None while connected."""

    def connected(self) -> None:
        self.delay = RECONNECT_MIN_DELAY
        if self.cause is not None:
            self.log.info("wake-up listener connected again")
            self.cause = None

    async def lost(self, exc: BaseException) -> None:
        """Log ``exc`` (see the module docstring) and wait out the back-off."""
        cause = str(exc).strip() or type(exc).__name__
        if self.cause is None:
            level = logging.WARNING
        elif cause == self.cause:
            level = logging.DEBUG
        else:
            level = logging.INFO
        self.log.log(level, "wake-up listener lost its connection (%s); retrying", cause)
        self.cause = cause
        await asyncio.sleep(self.delay)
        self.delay = min(self.delay * 2, RECONNECT_MAX_DELAY)
