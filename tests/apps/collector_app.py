"""An app whose one task reports, as its result, how the garbage collector
of the process that ran it is set: the youngest generation's threshold, and
how many objects are frozen (see conveyor.worker.collector)."""

from __future__ import annotations

import gc

import conveyor

app = conveyor.App()


@app.task()
def collector() -> dict[str, int]:
    return {"threshold": gc.get_threshold()[0], "frozen": gc.get_freeze_count()}
