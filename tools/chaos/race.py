"""One racer of the chaos suite's unique race.

    python -m tools.chaos.race --keys N --seed S --start T --out PATH

At wall-clock time ``T`` (so that the racers, started one after another,
begin together) it enqueues ``chaos_race`` once for every key ``0..N-1``,
in an order of its own (``--seed``), alone or in ``enqueue_many`` batches of
up to 10, and writes the task id each key was answered with to ``PATH`` as
JSON (``{"K": id}``). Every racer of a run enqueues every key, so each key
is raced by all of them; the task's unique key (``race:K``, held while the
task is stored) must give every racer the one task stored for it.

A call the store could not be reached for is made again (a cut connection
leaves its outcome unknown; the unique key makes the repeat safe) until
``--deadline`` seconds have passed; then, or on any other error, it exits 1.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

from conveyor.errors import BackendUnavailableError
from tools.chaos.app import app, chaos_race

RETRY_PAUSE = 0.2


def race(keys: int, seed: int, start: float, deadline: float) -> dict[int, int]:
    """Every key enqueued once by this racer: the id each was answered with."""
    rng = random.Random(seed)
    order = list(range(keys))
    rng.shuffle(order)
    answers: dict[int, int] = {}
    time.sleep(max(0.0, start - time.time()))
    give_up = time.monotonic() + deadline
    while order:
        size = min(len(order), rng.choice((1, 1, 10)))
        chunk, order = order[:size], order[size:]
        while True:
            try:
                if size == 1:
                    ids = [chaos_race.enqueue(k=chunk[0]).id]
                else:
                    ids = [h.id for h in app.enqueue_many(chaos_race, [{"k": k} for k in chunk])]
                break
            except BackendUnavailableError:
                if time.monotonic() > give_up:
                    raise
                time.sleep(RETRY_PAUSE)
        answers.update(zip(chunk, ids, strict=True))
    return answers


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.chaos.race", description=__doc__)
    parser.add_argument("--keys", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--start", type=float, default=0.0, help="wall-clock time to begin")
    parser.add_argument("--deadline", type=float, default=120.0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        answers = race(args.keys, args.seed, args.start, args.deadline)
    finally:
        app.close()
    args.out.write_text(json.dumps({str(k): i for k, i in sorted(answers.items())}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
