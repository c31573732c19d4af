"""Coroutine tasks in memory: sends, and a poll's effects (messages
consumed, children spawned, messages sent)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import datetime

from conveyor.backends.memory.enqueue import Enqueue
from conveyor.backends.memory.rows import Row
from conveyor.backends.params import Delivery, Effects
from conveyor.backends.stored import check_recipient
from conveyor.model import Cause, MessageKind


class Messages(Enqueue):
    """``send``, and the effects of a poll's completion."""

    def send(self, deliveries: Sequence[Delivery], now: datetime) -> list[int]:
        """Deliver every message, all or none, and return their ids: raises
        TaskNotFoundError, NoInboxError or TaskFinishedError (nothing sent)
        for a recipient that cannot take one. A waiting recipient is pending
        again, a sleeping one due now. A delivery whose idempotency key this
        recipient was sent under already delivers nothing: the first
        message's id comes back."""
        with self.lock:
            sent = {
                index: self.inboxes.keys[(d.task_id, d.idempotency_key)]
                for index, d in enumerate(deliveries)
                if d.idempotency_key is not None
                and (d.task_id, d.idempotency_key) in self.inboxes.keys
            }
            targets = {
                index: self._recipient(d.task_id)
                for index, d in enumerate(deliveries)
                if index not in sent
            }
            ids = []
            for index, d in enumerate(deliveries):
                if index in sent:
                    ids.append(sent[index])
                    continue
                message_id = self._deliver(
                    targets[index], d.sender_id, MessageKind.MESSAGE, d.body, now, d.trace
                )
                if d.idempotency_key is not None:
                    self.inboxes.keys[(d.task_id, d.idempotency_key)] = message_id
                ids.append(message_id)
            return ids

    def _recipient(self, task_id: int) -> Row:
        row = self.tasks.get(task_id)
        check_recipient(task_id, row.state if row else None, row is not None and row.inbox)
        assert row is not None
        return row

    def _apply(self, row: Row, effects: Effects, now: datetime) -> None:
        """A poll's consumed messages, spawns and sends (a send to a task
        that is missing, finished or has no inbox is dropped)."""
        self.inboxes.consume(row.id, set(effects.consumed))
        for new in effects.spawns:
            self._insert(dataclasses.replace(new, parent_id=row.id), now, Cause.SPAWN)
            self.woken.add(new.queue)
        for send in effects.sends:
            target = self.tasks.get(send.task_id)
            if target is not None and target.inbox and not target.state.is_terminal:
                self._deliver(target, row.id, MessageKind.MESSAGE, send.body, now, send.trace)
