"""The key layout of a Redis store: every key of one store, named once.

Every key starts with the store's base, ``{PREFIX}`` (the prefix in braces):
Redis Cluster hashes only the part in the first braces, so all of one
store's keys share one hash tag, hence one slot, and every script may touch
any of them atomically. The price, stated plainly: one store lives on one
shard of a cluster (use several prefixes to spread several stores).

Every key kind's name is written once, in :data:`LAYOUT` (and the
channels' in :data:`CHANNELS`): the functions below build the names in
Python, and :func:`lua` writes the Lua functions that build them in every
script (composed in front of the shared files by :mod:`.scripts`), so the
two cannot drift apart.

==============================  =====  ============================================
key                             type   holds
==============================  =====  ============================================
``{p}:layout``                  str    the layout version of this store's keys
``{p}:ids``                     str    the last task id given (INCR: ids ascend in
                                       enqueue order)
``{p}:task:ID``                 hash   one task's fields (see :mod:`.rows`)
``{p}:attempts:ID``             list   its attempt log: one JSON row per ended
                                       attempt (the running one is in the task's
                                       hash: attempt, worker_id, started_at, step,
                                       and its lease's nonce)
``{p}:delayed:Q``               zset   pending tasks of queue Q not due yet
                                       (score: run_at in ms; member: the id)
``{p}:ready:LEN:Q:NAME``        zset   due pending tasks of queue Q and task NAME
                                       without a concurrency key, all scored 0,
                                       each member the claim order
                                       ``inverted priority|run_at|id`` (fixed width)
                                       so that ZRANGEBYLEX walks claim order; LEN
                                       is Q's length (Q and NAME may hold ``:``)
``{p}:ready-names:Q``           set    the names whose ready set in Q is not empty
``{p}:pending:Q``               zset   every pending task of queue Q (score: run_at
                                       in ms), for ``next_due_at``
``{p}:queues``                  set    every queue a pending task was ever indexed
                                       in, for a task name's resume
``{p}:leases:Q``                zset   running tasks of queue Q (score: lease
                                       expiry in ms), for heartbeats and reclaim
``{p}:corrupt``                 set    ids of tasks whose fields did not read (written
                                       around conveyor), set aside by the script that
                                       met them: out of every claim index, ended
                                       failed (CorruptTask), their other fields kept
``{p}:state:S``                 zset   the ids of the tasks in state S (score: the
                                       id), written with every state change: the
                                       inspector's lists by state, bulk retries
``{p}:finished:S``              zset   the tasks finished in state S (terminal),
                                       all scored 0, each member ``finished_at
                                       ms|id`` (fixed width): retention's oldest
                                       first, by ZRANGEBYLEX
``{p}:unique:LEN:NAME:KEY``     str    the id of the task of NAME holding unique
                                       key KEY (LEN is NAME's length); deleted when
                                       the task leaves its scope or is deleted, and
                                       taken over once its period ended
``{p}:pauses``                  hash   ``queue:NAME`` or ``task:NAME`` -> the
                                       pause's time (ms); read by every claim
``{p}:schedules``               set    the names of the stored schedules
``{p}:schedule:NAME``           hash   one schedule (see :mod:`.flow`)
``{p}:schedule-releases``       zset   the releases of schedules ever synced (score:
                                       their last sync, ms)
``{p}:schedule-release:NAME``   hash   one release: its generation, task names and
                                       last sync (see :mod:`.flow`)
``{p}:schedule-generations``    str    the last generation given to a release (INCR)
``{p}:message-ids``             str    the last message id given (INCR: ascending)
``{p}:inbox:ID``                zset   task ID's unread messages (score: message
                                       id; member: the JSON array ``[id, sender id
                                       or "", kind, created_at ms, body]``)
``{p}:sent:ID``                 hash   idempotency key -> message id, of the sends
                                       to task ID that carried a key
``{p}:children:ID``             zset   the ids of task ID's children (score: the
                                       id), for a cancel's cascade
``{p}:workers``                 zset   registered worker ids (score: started_at ms)
``{p}:worker:ID``               hash   one worker's fields (see :mod:`.rows`)
``{p}:concurrency-keys``        zset   the concurrency keys with a row, in the
                                       claims' turn order (score: when a claim last
                                       took a task of the key, ms; ``-inf`` never;
                                       ties by key)
``{p}:concurrency:KEY``         hash   key KEY's row: ``max_running``, and with a
                                       rate ``rate_limit``, ``rate_period`` (s),
                                       ``tokens`` as of ``refilled_at`` (ms); kept
                                       while KEY has pending tasks or its bucket
                                       refills
``{p}:concurrency-ready:K``     zset   key K's due pending tasks, all scored 0,
                                       each member the claim order then
                                       ``|LEN:Q:NAME`` (its queue, LEN bytes long,
                                       and name): a claim walks them in order
``{p}:concurrency-pending:K``   set    the ids of key K's pending tasks, due or
                                       delayed (delayed ones wait in
                                       ``{p}:delayed:Q``)
``{p}:concurrency-leases:K``    zset   key K's running tasks (score: lease expiry
                                       in ms): its running count, without reading
                                       them (but for expired leases)
``{p}:concurrency-due:Q``       hash   task name -> how many keyed tasks of queue
                                       Q are in their keys' ready sets
``{p}:after:ID``                list   task ID's dependencies (its ``after``), ids in
                                       the order given: its edges, by position
``{p}:settled:ID``              set    the positions (from 0) of task ID's edges
                                       whose dependency's end was counted
``{p}:dependents:ID``           zset   the edges to task ID: ``DEPENDENT:POSITION``
                                       (score: the dependent's id), for its end to
                                       settle, one step per edge; the
                                       task's hash says ``dependents`` = ``1`` once
                                       one does, so that other ends skip the lookup
==============================  =====  ============================================

Two Pub/Sub channels share the names (not keys: nothing is stored):
``{p}:wake`` carries a queue name where tasks became due, ``{p}:cancel`` the
id of a running task whose cancel was requested (see :mod:`.listen`).

No key above expires: a task's keys (its hash, attempt log, inbox, send
keys, unique key and index entries) go when it is deleted or pruned, a
worker's when it is pruned; ``{p}:queues`` and empty ready-name sets are
never pruned (one member per queue or name ever used). A concurrency key's
row goes when a claim reads it with no pending task left (and a full
bucket); its sets go when they are empty.

A claim reads concurrency keys as ``lua/lib/flow.lua`` says: at most
``max(4 * limit, 16)`` rows of ``{p}:concurrency-keys``, in turn order; a
key with room gives the head of its ready set (the tasks of the claim's
queues and names, at most its room), a full one costs its row and its
expired leases, never the tasks behind it.

Layout version 2 added the state, pending, inbox, send-key, children and
worker keys: a store written with version 1 lacks the state and pending
indexes, so it is refused. Version 3 added the queues, finished, unique,
pauses and schedule keys (and ids of one enqueue need not be consecutive): a version 2
store lacks the finished index and the queues set, so it is refused too.
Version 4 added the concurrency keys and 22 arguments per task: a version 3
store holds no keyed task, so it reads as version 4 and is marked so when a
version 4 process opens it (a version 3 process then refuses it, as it
would misread its keyed tasks). Version 5 keeps a running attempt in its
task's hash rather than as the last row of its log: a version 3 or 4 store
is converted when a version 5 process opens it (``lua/open.lua``: each
running task's row moves into its hash, in one script), then marked; stop
the older workers first, as they would write rows version 5 does not read.

A task's hash may hold a ``trace_context`` field, and an inbox message a
sixth element, the sender's trace context (``conveyor.tracing``); neither
changes the layout: a message without a context keeps its five elements,
so a process that predates them reads every store whose App is untraced.
Dependencies do not change it either (the after, settled and dependents
keys, and a task's ``waiting_for``, ``after_policy``, ``receives`` and
``dependents`` fields): a store without them holds no dependent. A process
that predates them ends a dependency without settling its dependents, so a
store whose tasks have dependencies is run by processes that know them.
Neither do the schedule releases (a schedule's ``release`` field and the
release keys): a process that predates them ignores them, and its syncs
overwrite schedules whatever their release.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Final

from conveyor.errors import ConfigurationError

DEFAULT_PREFIX = "conveyor"
LAYOUT_VERSION = "5"
"""The version of this layout; a store written by another one is refused."""
UPGRADED = frozenset({"3", "4"})
"""Older layouts this one converts at ``open`` (``lua/open.lua``), then marks."""

LAYOUT: Final[Mapping[str, str]] = MappingProxyType(
    {
        "layout": "layout",
        "ids": "ids",
        "task": "task:{id}",
        "attempts": "attempts:{id}",
        "delayed": "delayed:{queue}",
        "ready": "ready:{#queue}:{queue}:{name}",
        "ready_names": "ready-names:{queue}",
        "pending": "pending:{queue}",
        "queues": "queues",
        "leases": "leases:{queue}",
        "corrupt": "corrupt",
        "state": "state:{state}",
        "finished": "finished:{state}",
        "unique": "unique:{#name}:{name}:{key}",
        "pauses": "pauses",
        "schedules": "schedules",
        "schedule": "schedule:{name}",
        "schedule_releases": "schedule-releases",
        "schedule_release": "schedule-release:{name}",
        "schedule_generations": "schedule-generations",
        "message_ids": "message-ids",
        "inbox": "inbox:{id}",
        "sent": "sent:{id}",
        "children": "children:{id}",
        "workers": "workers",
        "worker": "worker:{id}",
        "concurrency_keys": "concurrency-keys",
        "concurrency": "concurrency:{key}",
        "concurrency_ready": "concurrency-ready:{key}",
        "concurrency_pending": "concurrency-pending:{key}",
        "concurrency_leases": "concurrency-leases:{key}",
        "concurrency_due": "concurrency-due:{queue}",
        "after": "after:{id}",
        "settled": "settled:{id}",
        "dependents": "dependents:{id}",
        # Layouts 3 and 4 only: the index of every task, deleted by their upgrade.
        "tasks": "tasks",
    }
)
"""Every kind of key, by kind: the key after the store's base and ``:``.

``{part}`` is a part the caller gives (a task id, a queue, a name...), as
text; ``{#part}`` that part's length in UTF-8 bytes, as Lua's ``#`` counts
it, in front of a part that may hold ``:`` itself. The only place a key's
name is written: edit it here and both Python and the scripts follow (the
stored layout, hence :data:`LAYOUT_VERSION`, changes with it)."""

CHANNELS: Final[Mapping[str, str]] = MappingProxyType({"wake": "wake", "cancel": "cancel"})
"""The Pub/Sub channels, by kind: named as keys are, nothing stored."""

_HOLE = re.compile(r"\{(#?)([a-z_]+)\}")
_LITERAL = re.compile(r"[a-z:-]*")
_GLOB_SPECIALS = "\\*?[]"


def _parse(template: str) -> tuple[tuple[str | tuple[bool, str], ...], tuple[str, ...]]:
    """A template's pieces in order (literal text, or (counted, part)) and
    its parts in order of first use; ValueError for a template that Python's
    format or a Lua string could misread."""
    pieces: list[str | tuple[bool, str]] = []
    parts: list[str] = []
    at = 0
    for hole in _HOLE.finditer(template):
        pieces.append(template[at : hole.start()])
        counted, part = hole[1] == "#", hole[2]
        if part not in parts:
            parts.append(part)
        pieces.append((counted, part))
        at = hole.end()
    pieces.append(template[at:])
    for piece in pieces:
        if isinstance(piece, str) and not _LITERAL.fullmatch(piece):
            raise ValueError(f"a key's text may hold a-z, '-' and ':' only: {template!r}")
    return tuple(piece for piece in pieces if piece != ""), tuple(parts)


_PARSED: Final = {kind: _parse(template) for kind, template in LAYOUT.items()}


def _format(kind: str) -> tuple[Callable[..., str], int, tuple[int, ...]]:
    """Kind's name as the ``format`` of a text (given the base first, then
    each part, then the lengths of the counted ones), its number of parts,
    and the counted parts' indexes."""
    pieces, parts = _PARSED[kind]
    counted: list[int] = []
    text = "{0}:"
    for piece in pieces:
        if isinstance(piece, str):
            text += piece
        elif piece[0]:
            counted.append(parts.index(piece[1]))
            text += "{" + str(len(parts) + len(counted)) + "}"
        else:
            text += "{" + str(1 + parts.index(piece[1])) + "}"
    return text.format, len(parts), tuple(counted)


_FORMATS: Final = {kind: _format(kind) for kind in LAYOUT}


def check_prefix(prefix: object) -> str:
    """``prefix`` if it can name a store: a non-empty string of printable
    characters without braces (they would end the hash tag); else
    ConfigurationError."""
    if not isinstance(prefix, str) or not prefix or not prefix.isprintable():
        raise ConfigurationError("a Redis key prefix must be a non-empty printable string")
    if "{" in prefix or "}" in prefix:
        raise ConfigurationError(f"a Redis key prefix cannot hold braces: {prefix!r}")
    return prefix


def base(prefix: str) -> str:
    """The start of every key of the store: the prefix as a hash tag."""
    return "{" + prefix + "}"


def name_of(kind: str, prefix: str, *parts: object) -> str:
    """The key of ``kind`` (a kind of :data:`LAYOUT`) in the store of
    ``prefix``, with these parts in the order the kind's template first
    names them (each as ``str`` makes it); TypeError for another count."""
    fill, arity, counted = _FORMATS[kind]
    if len(parts) != arity:
        raise TypeError(f"the key {kind!r} takes {arity} parts, not {len(parts)}")
    if counted:
        parts = (*parts, *[len(str(parts[i]).encode()) for i in counted])
    return fill("{" + prefix + "}", *parts)


def lua() -> str:
    """The Lua functions that name the keys of :data:`LAYOUT` and the
    channels of :data:`CHANNELS`, composed in front of every script: locals
    ``BASE``, ``KEY_KIND`` for each kind without parts and ``CHANNEL_KIND``
    for each channel, set by ``set_base(base)`` (every call starts with
    it); and ``key_KIND(parts...)`` for each kind with parts. The same text
    on every call, in :data:`LAYOUT`'s order (a script's SHA depends on it)."""
    fixed = [kind for kind in LAYOUT if not _PARSED[kind][1]]
    names = [f"KEY_{kind.upper()}" for kind in fixed] + [
        f"CHANNEL_{kind.upper()}" for kind in CHANNELS
    ]
    lines = [
        "-- The key names, written by conveyor.backends.redis.keys from its LAYOUT",
        "-- (edit them there, nowhere else).",
        "local BASE",
        *(f"local {name}" for name in names),
        "local function set_base(base)",
        "  BASE = base",
        *(f"  KEY_{kind.upper()} = base .. ':{LAYOUT[kind]}'" for kind in fixed),
        *(f"  CHANNEL_{kind.upper()} = base .. ':{text}'" for kind, text in CHANNELS.items()),
        "end",
    ]
    for kind, (pieces, parts) in _PARSED.items():
        if not parts:
            continue
        terms = ["BASE"]
        literal = ":"
        for piece in pieces:
            if isinstance(piece, str):
                literal += piece
                continue
            if literal:
                terms.append(f"'{literal}'")
                literal = ""
            terms.append(("#" if piece[0] else "") + piece[1])
        if literal:
            terms.append(f"'{literal}'")
        lines.append(
            f"local function key_{kind}({', '.join(parts)}) return {' .. '.join(terms)} end"
        )
    return "\n".join(lines) + "\n"


def layout(prefix: str) -> str:
    return name_of("layout", prefix)


def task(prefix: str, task_id: int) -> str:
    return name_of("task", prefix, task_id)


def attempts(prefix: str, task_id: int) -> str:
    return name_of("attempts", prefix, task_id)


def pending(prefix: str, queue: str) -> str:
    return name_of("pending", prefix, queue)


def state(prefix: str, task_state: str) -> str:
    return name_of("state", prefix, task_state)


def workers(prefix: str) -> str:
    return name_of("workers", prefix)


def worker(prefix: str, worker_id: str) -> str:
    return name_of("worker", prefix, worker_id)


def finished(prefix: str, task_state: str) -> str:
    return name_of("finished", prefix, task_state)


def unique(prefix: str, name: str, key: str) -> str:
    """The key holding the id of the task of ``name`` that holds ``key``
    (the name's length in UTF-8 bytes first, as Lua counts it: a name may
    hold ``:``)."""
    return name_of("unique", prefix, name, key)


def queues(prefix: str) -> str:
    return name_of("queues", prefix)


def schedules(prefix: str) -> str:
    return name_of("schedules", prefix)


def schedule(prefix: str, name: str) -> str:
    return name_of("schedule", prefix, name)


def schedule_releases(prefix: str) -> str:
    return name_of("schedule_releases", prefix)


def schedule_release(prefix: str, name: str) -> str:
    return name_of("schedule_release", prefix, name)


def schedule_generations(prefix: str) -> str:
    return name_of("schedule_generations", prefix)


def pauses(prefix: str) -> str:
    return name_of("pauses", prefix)


def concurrency_keys(prefix: str) -> str:
    return name_of("concurrency_keys", prefix)


def concurrency(prefix: str, key: str) -> str:
    return name_of("concurrency", prefix, key)


def concurrency_ready(prefix: str, key: str) -> str:
    return name_of("concurrency_ready", prefix, key)


def concurrency_pending(prefix: str, key: str) -> str:
    return name_of("concurrency_pending", prefix, key)


def concurrency_leases(prefix: str, key: str) -> str:
    return name_of("concurrency_leases", prefix, key)


def wake_channel(prefix: str) -> str:
    """The Pub/Sub channel of queues where tasks became due."""
    return f"{base(prefix)}:{CHANNELS['wake']}"


def cancel_channel(prefix: str) -> str:
    """The Pub/Sub channel of running tasks whose cancel was requested."""
    return f"{base(prefix)}:{CHANNELS['cancel']}"


def children(prefix: str, task_id: int) -> str:
    return name_of("children", prefix, task_id)


def inbox(prefix: str, task_id: int) -> str:
    return name_of("inbox", prefix, task_id)


def pattern(prefix: str) -> str:
    """A SCAN pattern that matches exactly the store's keys (the prefix's
    glob characters escaped)."""
    escaped = "".join("\\" + c if c in _GLOB_SPECIALS else c for c in base(prefix))
    return escaped + ":*"
