"""The attempt lifecycle on Redis: claim (with the reclaim of expired leases),
heartbeat, finish, and the read of the cancels requested of running tasks.

A mixin of :class:`~conveyor.backends.redis.backend.RedisBackend`. A claim,
a heartbeat's batch and a finish's batch are each one script (``claim.lua``,
``heartbeat.lua``, ``finish.lua``), fenced by the lease token (with its
claim's random nonce) and a live lease, at the server's clock. A claimed
task whose stored fields do not read is set aside alone, ended ``failed``
(``CorruptTask``): by the script, or, for a row that does not decode here,
by a completion (:meth:`Attempts._set_aside`).
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Sequence
from typing import Any

from conveyor.backends.params import (
    ClaimedTask,
    ClaimParams,
    Completion,
    FinishParams,
    FinishResult,
    HeartbeatParams,
    HeartbeatResult,
    ProgressParams,
)
from conveyor.backends.redis import keys, rows
from conveyor.backends.redis.enqueue import check_new
from conveyor.backends.redis.store import RedisStore, translated
from conveyor.backends.stored import (
    CANCELLED_MEANWHILE,
    CRASH_BUDGET_SPENT,
    LEASE_EXPIRED,
    LEASE_EXPIRED_ERROR,
    Unread,
    key_scan,
)
from conveyor.errors import ConfigurationError
from conveyor.model import LeaseToken, Outcome, TaskState

log = logging.getLogger("conveyor.redis")

_FINISH_STATES = frozenset(
    {
        TaskState.SUCCEEDED,
        TaskState.FAILED,
        TaskState.CANCELLED,
        TaskState.PENDING,
        TaskState.WAITING,
    }
)


class Attempts(RedisStore):
    """Claims, heartbeats, finishes and the cancel read."""

    async def claim(self, params: ClaimParams) -> list[ClaimedTask]:
        """One script (``claim.lua``): see :meth:`Backend.claim`. Every claim
        looks for expired leases of its queues. A task whose stored fields do
        not read is set aside alone (ended failed, ``CorruptTask``): by the
        script, or, for a row that does not decode here, by a completion."""
        if params.limit <= 0 or not params.names or not params.queues:
            return []
        queues = list(dict.fromkeys(params.queues))
        nonce = secrets.token_hex(8)
        args = [
            rows.now_arg(params.now),
            f"{nonce} {params.worker_id}",
            params.limit,
            repr(float(params.lease)),
            LEASE_EXPIRED_ERROR,
            LEASE_EXPIRED,
            CANCELLED_MEANWHILE,
            CRASH_BUDGET_SPENT,
            key_scan(params.limit),
            len(queues),
            *queues,
            *dict.fromkeys(params.names),
        ]
        found = await self._run("claim", args)
        claimed, unread = rows.claimed_tasks(found, params.worker_id, nonce)
        if unread:
            await self._set_aside(unread)
        return claimed

    async def _set_aside(self, unread: Sequence[Unread]) -> None:
        """Claimed rows that do not read end ``failed`` (``CorruptTask``),
        each fenced by its token; one without a token waits out its lease,
        and the claim that meets it sets it aside. Never raises: the rest of
        the claim runs either way."""
        failures = [c for c in (bad.completion() for bad in unread) if c is not None]
        if not failures:
            return
        try:
            await self.finish(FinishParams(failures[0].token.worker_id, failures))
        except Exception as exc:
            log.error("claimed rows that do not read were not set aside: %s", exc)

    async def heartbeat(self, params: HeartbeatParams) -> HeartbeatResult:
        """One script for the batch: each lease renewed if live (its nonce
        too), else lost; a registered worker is marked seen (even with no
        tokens), an unregistered one is told so."""
        tokens = list(params.tokens)
        args: list[Any] = [rows.now_arg(params.now), params.worker_id, repr(float(params.lease))]
        for token in tokens:
            args += [token.task_id, token.attempt, token.nonce]
        *flags, registered = await self._run("heartbeat", args)
        renewed = frozenset(t for t, flag in zip(tokens, flags, strict=True) if flag)
        cancel = frozenset(t for t, flag in zip(tokens, flags, strict=True) if flag == 2)
        return HeartbeatResult(renewed, frozenset(tokens) - renewed, cancel, registered == 1)

    async def report_progress(self, params: ProgressParams) -> frozenset[LeaseToken]:
        """One script for the batch, fenced as a heartbeat (its nonce too)."""
        reports = list(params.reports)
        if not reports:
            return frozenset()
        args: list[Any] = [rows.now_arg(params.now), params.worker_id]
        for report in reports:
            token = report.token
            args += [token.task_id, token.attempt, token.nonce, report.text]
        flags = await self._run("progress", args)
        return frozenset(r.token for r, flag in zip(reports, flags, strict=True) if flag)

    async def cancel_requested(
        self, worker_id: str, tokens: Sequence[LeaseToken]
    ) -> frozenset[LeaseToken]:
        """Reads only: one pipelined HMGET per token."""
        if not tokens:
            return frozenset()
        with translated():
            async with self._redis.pipeline(transaction=False) as pipe:
                for t in tokens:
                    fields = ("attempt", "worker_id", "cancel_requested", "nonce")
                    pipe.hmget(keys.task(self.prefix, t.task_id), *fields)
                found = await pipe.execute()
        return frozenset(
            t
            for t, (attempt, worker, cancel, nonce) in zip(tokens, found, strict=True)
            if attempt == str(t.attempt)
            and worker == worker_id
            and cancel == "1"
            and nonce == t.nonce
        )

    async def finish(self, params: FinishParams) -> FinishResult:
        """One script for the batch (``finish.lua``), each completion fenced
        on its own, with its transition and a poll's effects (see
        :meth:`Backend.finish`). Raises ConfigurationError, writing nothing,
        for a completion that spawns a task with a priority beyond 32 bits."""
        completions = list(params.completions)
        if not completions:
            return FinishResult(frozenset(), frozenset())
        for c in completions:
            _check_completion(c)
        args = [rows.now_arg(params.now), params.worker_id, rows.finish_arg(completions)]
        flags = await self._run("finish", args)
        tokens = [c.token for c in completions]
        applied = frozenset(t for t, flag in zip(tokens, flags, strict=True) if flag)
        return FinishResult(applied, frozenset(tokens) - applied)


def _check_completion(c: Completion) -> None:
    if c.effects is not None:
        for spawn in c.effects.spawns:
            check_new(spawn)
    if c.next_state not in _FINISH_STATES:
        raise ConfigurationError(f"no completion of an attempt moves its task to {c.next_state}")
    if c.outcome is Outcome.IN_PROGRESS:
        raise ConfigurationError("a completion's outcome cannot be in_progress")
