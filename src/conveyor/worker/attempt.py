"""One attempt, from a claimed task to the completion that records it.

The attempt decodes the payload, starts the handler in its executor, waits
for it under the task's timeout, and turns what happened into a completion.
Whatever the handler does (raise anything, return garbage, ignore orders) the
attempt ends in a completion or, when the lease was lost, in nothing at all:
a worker that lost its lease writes nothing about the task.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from conveyor import payload as codec
from conveyor.backends.capabilities import AttemptTransaction
from conveyor.backends.params import ClaimedTask, Completion
from conveyor.context import TaskContext
from conveyor.coroutine import Coroutine, PollEnd
from conveyor.dependencies import not_needed, parse_receives, with_received
from conveyor.errors import (
    AttemptTimeoutError,
    BackendUnavailableError,
    CancelledByRequest,
    ConfigurationError,
    LeaseLostError,
    PayloadError,
    StopAttempt,
    WorkerShutdown,
)
from conveyor.middleware import AttemptInfo
from conveyor.model import Outcome
from conveyor.records import DependencyRecord
from conveyor.task import TaskDef
from conveyor.worker import outcomes
from conveyor.worker.executors import (
    Execution,
    HandlerExit,
    InlineExecution,
    ProcessExecution,
    ThreadExecution,
)
from conveyor.worker.processes import ProcessPool
from conveyor.workflow import Done, Next, Workflow

log = logging.getLogger("conveyor.worker")


class RunningAttempt:
    """A claimed task being run, and the means to stop it."""

    __slots__ = (
        "_abandoned",
        "ctx",
        "definition",
        "dependencies",
        "execution",
        "info",
        "loop",
        "max_result_bytes",
        "processes",
        "started",
        "superseded",
        "task",
    )

    def __init__(
        self,
        task: ClaimedTask,
        definition: TaskDef,
        ctx: TaskContext,
        max_result_bytes: int,
        processes: ProcessPool,
        loop: asyncio.AbstractEventLoop,
        dependencies: Callable[[int], Awaitable[list[DependencyRecord]]] | None = None,
    ) -> None:
        self.task = task
        self.definition = definition
        self.ctx = ctx
        self.max_result_bytes = max_result_bytes
        self.processes = processes
        """The worker's handler processes, for a ``process=True`` handler."""
        self.dependencies = dependencies
        """Reads a task's dependencies, for one that receives their outcomes."""
        self.loop = loop
        """The worker's event loop: handed down, not looked up (each look-up
        asks the kernel for the process id, on Python 3.11)."""
        self.execution: Execution | None = None
        self._abandoned = False
        self.started = time.monotonic()
        """When the worker began the attempt (monotonic seconds)."""
        self.superseded = False
        self.info: AttemptInfo | None = None
        """What the worker's middleware were told of this attempt."""
        """The store handed this attempt's lease token out again (it lost the
        task: a restore, a wipe): nothing of this attempt is written."""

    @property
    def kind(self) -> str:
        """``step`` for a step workflow's step, ``poll`` for a coroutine
        task's poll, ``attempt`` for any other task."""
        if isinstance(self.definition, Workflow):
            return "step"
        if isinstance(self.definition, Coroutine):
            return "poll"
        return "attempt"

    def stop(self, reason: StopAttempt) -> None:
        """Order the handler to stop for ``reason`` (the first reason wins)."""
        if self.ctx._request_stop(reason) and self.execution is not None:
            self.execution.stop()

    def abandon(self) -> None:
        """Stop waiting for a thread handler that ignores the order to stop:
        the attempt then records nothing (its lease is left to expire)."""
        self._abandoned = True
        if self.execution is not None:
            self.execution.abandon()

    async def run(self) -> Completion | None:
        """Run the handler; the completion to record, or None if nothing is
        left to record. A task its claim found past its expiry time ends
        cancelled without running."""
        if self.task.expired_at is not None:
            return outcomes.expired(self.task, self.task.expired_at)
        if self.task.receives is not None:
            try:
                needed = await self._receive(self.task.receives)
            except (PayloadError, BackendUnavailableError) as exc:  # the latter is retried
                return outcomes.failed(self.task, exc)
            if not needed:
                return outcomes.not_needed(self.task)
        try:
            kwargs = self._arguments()
        except PayloadError as exc:
            return outcomes.failed(self.task, exc)
        if self.ctx.stop_reason is not None:
            return self._stopped_before_start()
        try:
            self.execution = self._start(kwargs)
        except Exception as exc:
            return outcomes.failed(self.task, exc)
        value, error = await self._wait(self.execution)
        transaction: AttemptTransaction | None = self.ctx._transaction
        if self._abandoned:
            # The handler may still be running: its task must not be released
            # (its lease is left to expire), and its transaction is ended from
            # outside, since its thread may still be writing on it.
            if transaction is not None:
                await transaction.abandon()
            return None
        completion = self._completion(value, error)
        if transaction is not None:
            return await self._settle_transaction(transaction, completion)
        return completion

    async def _receive(self, stored: str) -> bool:
        """Put what the task's dependencies ended with in its payload (see
        :mod:`conveyor.dependencies`), read now, at each attempt; False for
        a task that runs only if one failed, when every one succeeded."""
        if self.dependencies is None:
            raise PayloadError("the worker cannot read this task's dependencies")
        receives = parse_receives(stored)
        records = await self.dependencies(self.task.token.task_id)
        if not_needed(receives, records):
            return False
        self.task.payload = with_received(self.task.payload, receives, records)
        return True

    def _arguments(self) -> dict[str, Any]:
        args = codec.decode(self.task.payload)
        if not isinstance(args, dict):
            raise PayloadError("the stored payload is not a JSON object")
        self.ctx.payload = args
        try:
            return self.definition.build_kwargs(args, self.ctx)
        except PayloadError:
            raise
        except Exception as exc:
            raise PayloadError(f"payload does not fit the handler: {exc}") from exc

    def _start(self, kwargs: dict[str, Any]) -> Execution:
        fn = self.definition.fn
        if self.definition.executor == "async":
            return InlineExecution(fn(**kwargs), self.loop)
        if self.definition.executor == "thread":
            label = f"conveyor:{self.task.name}:{self.task.token.task_id}"
            return ThreadExecution(lambda: fn(**kwargs), label)
        return ProcessExecution(
            self.processes, fn.__module__, fn.__qualname__, self.task.payload, self.max_result_bytes
        )

    async def _wait(self, execution: Execution) -> tuple[Any, BaseException | None]:
        timer = None
        if self.task.timeout is not None:
            timer = self.loop.call_later(self.task.timeout, self._time_out)
        try:
            # A timed-out handler keeps its slot until it has really stopped.
            return await execution.wait(), None
        except BaseException as exc:
            return None, exc
        finally:
            if timer is not None:
                timer.cancel()

    def _time_out(self) -> None:
        self.stop(AttemptTimeoutError(f"timed out after {self.task.timeout}s"))

    def _completion(self, value: Any, error: BaseException | None) -> Completion | None:
        reason = self.ctx.stop_reason
        if isinstance(reason, LeaseLostError):
            return None
        if isinstance(reason, AttemptTimeoutError):
            return outcomes.failed(self.task, reason, Outcome.TIMED_OUT)
        if error is None:
            return self._recorded(value)
        if isinstance(reason, CancelledByRequest):
            return outcomes.cancelled(self.task)
        if isinstance(reason, WorkerShutdown):
            return outcomes.interrupted(self.task)
        if isinstance(error, HandlerExit):
            return outcomes.failed(self.task, error.original)
        return outcomes.failed(self.task, error)

    def _recorded(self, value: Any) -> Completion:
        """A success: the result to store, or a workflow's end or next step."""
        try:
            if isinstance(self.definition, Workflow) and isinstance(value, Done | Next):
                return self.definition.completion(self.task, value, self.max_result_bytes)
            if isinstance(self.definition, Coroutine) and isinstance(value, PollEnd):
                return self.definition.completion(self.task, value, self.max_result_bytes)
            result = self.definition.encode_result(value, self.max_result_bytes)
            return outcomes.succeeded(self.task, result)
        except (PayloadError, ConfigurationError) as exc:
            return outcomes.failed(self.task, PayloadError(f"the result is not stored: {exc}"))

    def _stopped_before_start(self) -> Completion | None:
        reason = self.ctx.stop_reason
        if isinstance(reason, CancelledByRequest):
            return outcomes.cancelled(self.task)
        if isinstance(reason, WorkerShutdown):
            return outcomes.interrupted(self.task)
        return None

    async def _settle_transaction(
        self, transaction: AttemptTransaction, completion: Completion | None
    ) -> Completion | None:
        """Commit the handler's writes with its success, or roll them back."""
        if completion is None or completion.outcome is not Outcome.SUCCEEDED:
            await transaction.rollback()
            return completion
        try:
            committed = await transaction.commit_success(completion)
        except BackendUnavailableError as exc:
            # The commit may or may not have happened: release the task without
            # charging the handler. If it did commit, this fenced write is
            # simply rejected.
            return outcomes.interrupted(self.task, f"the commit's fate is unknown: {exc}")
        except Exception as exc:  # e.g. a deferred constraint at COMMIT
            return outcomes.failed(self.task, exc)
        if not committed:
            log.warning(
                "lease lost before commit: the handler's writes were rolled back",
                extra={"task_id": self.task.token.task_id, "attempt": self.task.token.attempt},
            )
        return None  # recorded (or rejected) already, inside the transaction
