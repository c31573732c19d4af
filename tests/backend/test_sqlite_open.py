"""Many connections opening one new SQLite file at once: each waits its
turn to switch it to WAL, as any write waits for the file's lock, instead
of failing at once with "database is locked" (which made a worker that
opened a new store beside its own app exit at start)."""

from __future__ import annotations

import threading
from pathlib import Path

from conveyor.backends.sqlite.database import connect

ROUNDS = 300
OPENERS = 12


def test_connections_opening_one_new_file_at_once_all_open(tmp_path: Path) -> None:
    failures: list[BaseException] = []
    for index in range(ROUNDS):
        path = str(tmp_path / f"{index}.db")
        barrier = threading.Barrier(OPENERS)

        def open_one(path: str = path, barrier: threading.Barrier = barrier) -> None:
            barrier.wait()
            try:
                connect(path, 10.0, "full").close()
            except Exception as exc:
                failures.append(exc)

        threads = [threading.Thread(target=open_one) for _ in range(OPENERS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert failures == []
