"""The inboxes of the memory store's coroutine tasks."""

from __future__ import annotations

import itertools
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime

from conveyor import payload as codec
from conveyor.model import Message, MessageKind


@dataclass
class Inboxes:
    """Each task's unread messages, oldest first, and the message each
    (recipient, idempotency key) sent. Storage only: the store decides who
    may take a message and wakes the recipient."""

    ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    unread: dict[int, list[Message]] = field(default_factory=dict)
    keys: dict[tuple[int, str], int] = field(default_factory=dict)

    def append(
        self,
        task_id: int,
        sender: int | None,
        kind: MessageKind,
        body: str,
        now: datetime,
        trace: str | None = None,
    ) -> int:
        """Store a message (``body`` is encoded JSON) at the end of the inbox; its id."""
        message = Message(next(self.ids), task_id, sender, kind, codec.decode(body), now, trace)
        self.unread.setdefault(task_id, []).append(message)
        return message.id

    def holds(self, task_id: int) -> bool:
        """Whether the task has unread messages."""
        return bool(self.unread.get(task_id))

    def read(self, task_id: int) -> list[Message]:
        return list(self.unread.get(task_id, ()))

    def consume(self, task_id: int, ids: Collection[int]) -> None:
        """Drop these messages (those a poll saw) from the task's inbox."""
        self.unread[task_id] = [m for m in self.unread.get(task_id, ()) if m.id not in ids]
