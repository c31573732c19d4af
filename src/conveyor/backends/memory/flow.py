"""Flow control in memory: pauses, as the SQL backends keep them in a table."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from conveyor.model import Pause, PauseKind


@dataclass
class Pauses:
    """Paused queues and task names, by (kind, name). Not locked here: the
    store calls these under its own lock."""

    held: dict[tuple[PauseKind, str], datetime] = field(default_factory=dict)

    def pause(self, kind: PauseKind, name: str, now: datetime) -> bool:
        if (kind, name) in self.held:
            return False
        self.held[(kind, name)] = now
        return True

    def resume(self, kind: PauseKind, name: str) -> bool:
        return self.held.pop((kind, name), None) is not None

    def listed(self) -> list[Pause]:
        return [Pause(kind, name, at) for (kind, name), at in sorted(self.held.items())]

    def serves(self, queue: str, name: str) -> bool:
        """Whether neither ``queue`` nor task ``name`` is paused."""
        return (PauseKind.QUEUE, queue) not in self.held and (
            PauseKind.TASK,
            name,
        ) not in self.held

    def served(self, names: set[str], queues: set[str]) -> tuple[set[str], set[str]]:
        """``names`` and ``queues`` without the paused ones."""
        if not self.held:
            return names, queues
        return (
            {n for n in names if (PauseKind.TASK, n) not in self.held},
            {q for q in queues if (PauseKind.QUEUE, q) not in self.held},
        )
