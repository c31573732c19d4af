"""The attempt log: each attempt's ending, logged by the worker that ran it.

A middleware (:mod:`conveyor.middleware`) each worker puts around its own
attempts, outside the client's: it logs after the attempt's span ended and
its AttemptEnded was emitted. It logs on the ``conveyor.worker`` logger.
"""

from __future__ import annotations

import logging
import time

from conveyor.backends.params import Completion
from conveyor.middleware import AttemptInfo, Middleware, Run
from conveyor.model import Outcome, TaskState

log = logging.getLogger("conveyor.worker")


class AttemptLog(Middleware):
    """Logs each attempt that ends with a completion to record: a success at
    INFO with its duration (DEBUG when ``quiet``), a retry at WARNING, a
    final failure at ERROR with its traceback. An attempt the worker crashed
    on, abandoned or found superseded is not logged here."""

    __slots__ = ("level",)

    def __init__(self, quiet: bool = False) -> None:
        self.level = logging.DEBUG if quiet else logging.INFO

    async def attempt(self, run: Run, info: AttemptInfo) -> Completion | None:
        completion = await run()
        if completion is not None and not info.superseded:
            self.ended(info, completion)
        return completion

    def ended(self, info: AttemptInfo, completion: Completion) -> None:
        """Log the ending of the attempt ``info`` with ``completion``."""
        succeeded = completion.outcome is Outcome.SUCCEEDED
        level = self.level
        if succeeded and not log.isEnabledFor(level):
            return
        token = completion.token
        seconds = round(time.monotonic() - info.started, 3)
        name = info.task.name
        fields = {
            "task_id": token.task_id,
            "attempt": token.attempt,
            "task_name": name,
            "duration": seconds,
            "worker_id": info.worker_id,
        }
        if succeeded:
            log.log(
                level, "task %s %s succeeded in %.3fs", name, token.task_id, seconds, extra=fields
            )
            return
        error = completion.error
        detail = f"{error.type}: {error.message}" if error else completion.outcome.value
        if completion.next_state is TaskState.PENDING and completion.retry_delay is not None:
            log.warning(
                "task %s %s attempt %s %s after %.3fs (%s); again in %.1fs",
                name,
                token.task_id,
                token.attempt,
                completion.outcome.value,
                seconds,
                detail,
                completion.retry_delay,
                extra=fields,
            )
        elif completion.next_state is TaskState.FAILED:
            trace = f"\n{error.traceback.rstrip()}" if error and error.traceback else ""
            log.error(
                "task %s %s failed for good after %s attempt(s) (%s)%s",
                name,
                token.task_id,
                token.attempt,
                detail,
                trace,
                extra=fields,
            )
        else:
            log.warning(
                "task %s %s %s after %.3fs: %s",
                name,
                token.task_id,
                completion.next_state.value,
                seconds,
                detail,
                extra=fields,
            )
