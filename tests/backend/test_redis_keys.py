"""The Redis key names are written once (keys.LAYOUT) and read alike by
Python and by the scripts; the scripts' library files stay small.

The names below are the stored layout, byte for byte: a change to them is a
change of layout (keys.LAYOUT_VERSION), which existing stores would refuse.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from importlib import resources

import pytest
import redis.asyncio as aioredis

from conveyor.backends.redis import keys, scripts
from tests.conftest import REDIS_URL

PREFIX = "tenant:1"
PARTS: dict[str, object] = {
    "id": 42,
    "queue": "q:ü ue",
    "name": "na:mé",
    "key": "k:1",
    "state": "pending",
}
"""A sample of every part a key takes: queues, names and keys may hold
``:`` and letters beyond ASCII (counted in UTF-8 bytes)."""

EXPECTED = {
    "layout": "{tenant:1}:layout",
    "ids": "{tenant:1}:ids",
    "task": "{tenant:1}:task:42",
    "attempts": "{tenant:1}:attempts:42",
    "delayed": "{tenant:1}:delayed:q:ü ue",
    "ready": "{tenant:1}:ready:7:q:ü ue:na:mé",
    "ready_names": "{tenant:1}:ready-names:q:ü ue",
    "pending": "{tenant:1}:pending:q:ü ue",
    "queues": "{tenant:1}:queues",
    "leases": "{tenant:1}:leases:q:ü ue",
    "corrupt": "{tenant:1}:corrupt",
    "state": "{tenant:1}:state:pending",
    "finished": "{tenant:1}:finished:pending",
    "unique": "{tenant:1}:unique:6:na:mé:k:1",
    "pauses": "{tenant:1}:pauses",
    "schedules": "{tenant:1}:schedules",
    "schedule": "{tenant:1}:schedule:na:mé",
    "schedule_releases": "{tenant:1}:schedule-releases",
    "schedule_release": "{tenant:1}:schedule-release:na:mé",
    "schedule_generations": "{tenant:1}:schedule-generations",
    "message_ids": "{tenant:1}:message-ids",
    "inbox": "{tenant:1}:inbox:42",
    "sent": "{tenant:1}:sent:42",
    "children": "{tenant:1}:children:42",
    "workers": "{tenant:1}:workers",
    "worker": "{tenant:1}:worker:42",
    "concurrency_keys": "{tenant:1}:concurrency-keys",
    "concurrency": "{tenant:1}:concurrency:k:1",
    "concurrency_ready": "{tenant:1}:concurrency-ready:k:1",
    "concurrency_pending": "{tenant:1}:concurrency-pending:k:1",
    "concurrency_leases": "{tenant:1}:concurrency-leases:k:1",
    "concurrency_due": "{tenant:1}:concurrency-due:q:ü ue",
    "after": "{tenant:1}:after:42",
    "settled": "{tenant:1}:settled:42",
    "dependents": "{tenant:1}:dependents:42",
    "tasks": "{tenant:1}:tasks",
}
EXPECTED_CHANNELS = {"wake": "{tenant:1}:wake", "cancel": "{tenant:1}:cancel"}


@pytest.fixture
async def raw() -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(REDIS_URL, decode_responses=True)
    yield client
    await client.aclose()


def parts_of(kind: str) -> list[object]:
    """The sample parts of ``kind``, in the order its template names them."""
    template = keys.LAYOUT[kind]
    named = [part for part in PARTS if "{" + part + "}" in template]
    return sorted(named, key=lambda part: template.index("{" + part + "}"))


async def test_python_and_the_scripts_name_every_key_alike(raw: aioredis.Redis) -> None:
    assert set(keys.LAYOUT) == set(EXPECTED)
    assert set(keys.CHANNELS) == set(EXPECTED_CHANNELS)
    values = {part: str(value) for part, value in PARTS.items()}
    order = list(values)
    terms = []
    for kind in keys.LAYOUT:
        parts = parts_of(kind)
        if not parts:
            terms.append(f"KEY_{kind.upper()}")
        else:
            args = ", ".join(f"ARGV[{order.index(str(part)) + 1}]" for part in parts)
            terms.append(f"key_{kind}({args})")
    terms += [f"CHANNEL_{kind.upper()}" for kind in keys.CHANNELS]
    script = scripts.shared() + "begin(KEYS[1])\nreturn {" + ", ".join(terms) + "}\n"
    from_lua = await raw.eval(script, 1, keys.base(PREFIX), *values.values())  # type: ignore[misc]
    assert from_lua == [*EXPECTED.values(), *EXPECTED_CHANNELS.values()]
    for kind, expected in EXPECTED.items():
        given = [PARTS[part] for part in parts_of(kind)]
        assert keys.name_of(kind, PREFIX, *given) == expected
        function = getattr(keys, kind, None)
        if function is not None:
            assert function(PREFIX, *given) == expected
    assert keys.wake_channel(PREFIX) == EXPECTED_CHANNELS["wake"]
    assert keys.cancel_channel(PREFIX) == EXPECTED_CHANNELS["cancel"]
    with pytest.raises(TypeError):
        keys.name_of("unique", PREFIX, "only a name")


DIGEST = (
    "import hashlib\n"
    "from conveyor.backends.redis import keys, scripts\n"
    "texts = [keys.lua(), scripts.library()[0], *scripts.sources().values()]\n"
    "print(hashlib.sha256('\\0'.join(texts).encode()).hexdigest())\n"
)
"""A program printing a digest of the key names and every script."""


def test_the_scripts_read_the_same_in_every_process() -> None:
    """The key names and the scripts are composed alike whatever the hash
    seed: a script's SHA names it to the server, and a library's digest
    names it for every process of one version."""
    found = set()
    for seed in ("1", "2", "3"):
        found.add(
            subprocess.run(
                [sys.executable, "-c", DIGEST],
                env={**os.environ, "PYTHONHASHSEED": seed},
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        )
    texts = [keys.lua(), scripts.library()[0], *scripts.sources().values()]
    assert found == {hashlib.sha256("\0".join(texts).encode()).hexdigest() + "\n"}


def test_no_lua_file_is_over_600_lines() -> None:
    folder = resources.files("conveyor.backends.redis") / "lua"
    sizes = {}
    pending = [folder]
    while pending:
        for entry in pending.pop().iterdir():
            if entry.is_dir():
                pending.append(entry)
            elif entry.name.endswith(".lua"):
                sizes[entry.name] = len(entry.read_text(encoding="utf-8").splitlines())
    assert "flow.lua" in sizes
    assert {name: size for name, size in sizes.items() if size > 600} == {}
