"""Coroutine tasks' messages on Redis: sends and inboxes.

A mixin of :class:`~conveyor.backends.redis.backend.RedisBackend`. A send
is one script (``send.lua``), all or none; an inbox is one sorted set of
its task (``{p}:inbox:ID``, see :mod:`.keys`), read with one ZRANGE. A
poll's completion, with its consumed messages, sends and spawns, is a
finish (:mod:`.attempts`, ``lua/lib/messages.lua``).
"""

from __future__ import annotations

from typing import cast

from conveyor.backends.params import SendParams
from conveyor.backends.redis import keys, rows
from conveyor.backends.redis.store import RedisStore, translated
from conveyor.backends.stored import check_recipient
from conveyor.errors import BackendError
from conveyor.model import Message


class Messages(RedisStore):
    """Sends and inboxes."""

    async def send(self, params: SendParams) -> list[int]:
        """Deliver every message in one script (``send.lua``), all or none,
        and return their ids (ascending in send order). Raises
        TaskNotFoundError, NoInboxError or TaskFinishedError, sending
        nothing, for a recipient that cannot take a message; a delivery
        whose idempotency key its recipient was sent under already returns
        the first message's id and delivers nothing. Idempotency keys are
        kept as long as their recipient (deleted or pruned with it)."""
        deliveries = list(params.deliveries)
        if not deliveries:
            return []
        found = await self._run("send", [rows.now_arg(params.now), *rows.send_args(deliveries)])
        if not found[0]:
            _, task_id, state, inbox = found
            check_recipient(int(task_id), state or None, inbox == "1")
            raise BackendError(f"Redis refused a send to task {task_id} without a reason")
        return [int(message_id) for message_id in found[1:]]

    async def inbox(self, task_id: int) -> list[Message]:
        """The task's unread messages, oldest first (one ZRANGE); [] for a
        task without messages or without an inbox. Raises BackendError for a
        message that does not read."""
        with translated():
            found = cast(
                list[str], await self._redis.zrange(keys.inbox(self.prefix, task_id), 0, -1)
            )
        return [rows.message(task_id, text) for text in found]
