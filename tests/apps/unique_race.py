"""Run by tests/test_unique.py in several processes at once: enqueue the
same unique keys in a shuffled order, and print the ids each got."""

from __future__ import annotations

import json
import os
import random
import sys

import conveyor

app = conveyor.App(os.environ["CONVEYOR_URL"], schema=os.environ.get("CONVEYOR_SCHEMA"))


@app.task(unique=conveyor.Unique(key=lambda args: f"user:{args['user']}", scope="active"))
def refresh(user: int, sender: int) -> None:
    return None


def main() -> None:
    keys = int(sys.argv[1])
    me = int(sys.argv[2])
    users = list(range(keys))
    random.Random(me).shuffle(users)
    got = {}
    for start in range(0, keys, 10):  # a batch per ten keys, and single enqueues
        chunk = users[start : start + 10]
        handles = app.enqueue_many(refresh, [{"user": u, "sender": me} for u in chunk])
        got.update({u: h.id for u, h in zip(chunk, handles, strict=True)})
        for user in chunk[:3]:
            assert refresh.enqueue(user=user, sender=me).id == got[user]
    print(json.dumps(got))
    app.close()


if __name__ == "__main__":
    main()
