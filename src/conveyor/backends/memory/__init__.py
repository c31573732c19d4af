"""The in-memory backend (``memory://NAME``): for tests of user code.

NOT durable: everything lives in this process and is gone when it exits.
Backends opened with the same URL in one process share one store (a worker
opens several), guarded by one lock, so every operation is atomic. It keeps
the same contract as the SQL backends for leases, fencing, the attempt log,
the crash budget and cancel, with the clock of this process, or the one
set for the store's name (``MemoryBackend.set_clock``: the fake clock of
:mod:`conveyor.testing`), or an injected ``now``. It offers no
transactional enqueue and no attempt transaction; an enqueue wakes the
idle workers of its store at once (they are all in this process).

Inline mode (``memory://NAME?inline=true``) is for tests of code that
enqueues: the App runs every due task of the enqueued queues, in this
process, before ``enqueue`` returns (see :mod:`conveyor.testing`).

Modules: ``store`` is the task state machine itself, pure and synchronous
(the reference model the SQL backends are checked against); ``rows`` the
task row it keeps; ``backend`` the async :class:`MemoryBackend` around it.
"""

from conveyor.backends.memory.backend import Clock, MemoryBackend

__all__ = ["Clock", "MemoryBackend"]
