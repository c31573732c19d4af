"""Periodic tasks: a nightly report in Paris time and a cache refreshed every
five minutes. Run a worker (``conveyor worker examples.schedules:app``) and
``conveyor schedules`` shows when each fires next."""

from __future__ import annotations

from datetime import timedelta

import conveyor

app = conveyor.App()


@app.periodic(cron="30 2 * * *", tz="Europe/Paris")  # every night at 02:30, Paris time
@app.task()
async def nightly_report() -> None:
    print("the nightly report")


@app.periodic(every=timedelta(minutes=5), missed="skip")
@app.task()
async def refresh_cache() -> None:
    print("the cache is fresh")


if __name__ == "__main__":
    for schedule in app.schedules.values():
        print(f"{schedule.name}: {schedule.describe()}")
