"""A handler that writes each execution to a ledger file, for multi-process tests.

Each line is ``task_id attempt pid``, appended with O_APPEND (one write per
line), so executions whose completion never landed are still visible.
"""

from __future__ import annotations

import os
import random
import time

import conveyor
from conveyor import TaskContext

app = conveyor.App()


@app.task()
def work(n: int, ledger: str, ctx: TaskContext) -> int:
    time.sleep(random.uniform(0.02, 0.06))
    line = f"{ctx.task_id} {ctx.attempt} {os.getpid()}\n".encode()
    fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
    return n
