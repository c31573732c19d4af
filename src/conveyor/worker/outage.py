"""The store's reachability as one worker sees it, logged once per change.

The parts of a worker that call the store on their own schedule (claims,
completions, the heartbeat, registration) report each call's fate here.
The store is unreachable from a part's first failure until every part that
failed has succeeded again. The first failure of each part logs a WARNING
that names the part and the cause, a change of its cause (another error
text) an INFO line, and repeats log at DEBUG, so a worker waiting out a
database restart writes a few lines, not one per try. The end of an
outage logs, at INFO, how long it lasted and how many calls failed. A call
the store answered with a refusal (:meth:`Outage.refused`) is no outage:
it is said as such. The parts retry with their own back-off (see each);
this only decides what is said.

Thread-safe: the heartbeat reports from its own thread.
"""

from __future__ import annotations

import logging
import threading
import time

from conveyor.errors import BackendError, BackendUnavailableError
from conveyor.worker.texts import reason

log = logging.getLogger("conveyor.worker")


def answered(exc: BaseException) -> bool:
    """Whether a failed call's error is an answer of the store (a refusal, or
    a reply that does not read) rather than a store out of reach."""
    if isinstance(exc, BackendUnavailableError):
        return False
    return isinstance(exc, BackendError | ValueError | TypeError | LookupError)


class Outage:
    """Failures of calls to the store, and the log lines they deserve."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._since: float | None = None
        self._causes: dict[str, str] = {}
        """The parts failing now, each with its last cause."""
        self._refusals: dict[str, str] = {}
        """The parts the store refuses now, each with its last cause."""
        self.failures = 0
        """Failed calls in the current outage (0: the store is reachable)."""
        self.logged = 0
        """WARNING lines written, over the worker's life."""

    @property
    def down(self) -> bool:
        return self._since is not None

    def failed(self, part: str, exc: BaseException) -> None:
        """A call of ``part`` (e.g. ``"claim"``) failed with ``exc``."""
        cause = reason(exc)
        with self._lock:
            self.failures += 1
            first = self._since is None
            if first:
                self._since = time.monotonic()
            part_first = part not in self._causes
            changed = self._causes.get(part) != cause
            self._causes[part] = cause
        if not changed:
            log.debug("store still unreachable (%s): %s", part, cause)
        elif part_first:
            self.logged += 1
            suffix = "; retrying with back-off" if first else ""
            log.warning("store unreachable (%s): %s%s", part, cause, suffix)
        else:
            log.info("store still unreachable (%s): %s", part, cause)

    def refused(self, part: str, exc: BaseException) -> None:
        """A call of ``part`` failed with ``exc``, an answer of the store (it
        refused the call, or its answer did not read): not an outage. Logged
        at ERROR once per cause, repeats at DEBUG; the part retries with its
        back-off as after a failure."""
        cause = reason(exc)
        with self._lock:
            repeated = self._refusals.get(part) == cause
            self._refusals[part] = cause
        if repeated:
            log.debug("the store still refuses the %s: %s", part, cause)
        else:
            log.error("the store refused the %s (it answered): %s", part, cause)

    def ok(self, part: str) -> None:
        """A call of ``part`` succeeded. Free while the store is reachable."""
        if self._refusals:
            with self._lock:
                self._refusals.pop(part, None)
        if self._since is None:
            return
        with self._lock:
            self._causes.pop(part, None)
            if self._causes or self._since is None:
                return
            since, failures = self._since, self.failures
            self._since, self.failures = None, 0
        log.info(
            "store reachable again after %.1fs (%d failed calls)",
            time.monotonic() - since,
            failures,
        )
