"""Handlers the process executor imports by module and name in its child."""

from __future__ import annotations

import os
import time

import conveyor

app = conveyor.App(os.environ.get("CONVEYOR_URL", "postgresql://127.0.0.1:5432/test"))


def _spin(seconds: float) -> int:
    deadline = time.monotonic() + seconds
    count = 0
    while time.monotonic() < deadline:
        count += 1
    return count


@app.task(process=True)
def spin_in_process(seconds: float) -> str:
    _spin(seconds)
    return f"spun {seconds}s in {os.getpid()}"


@app.task()
def spin_in_thread(seconds: float) -> str:
    _spin(seconds)
    return f"spun {seconds}s"


@app.task(process=True)
def crash_process() -> None:
    os._exit(3)


def huge_error(megabytes: int) -> None:
    """Registered by tests with ``process=True``: a message of ``megabytes`` MB."""
    raise RuntimeError("\x00" * (megabytes * 1_000_000))


def huge_result(megabytes: int) -> str:
    """Registered by tests with ``process=True``: a result of ``megabytes`` MB."""
    return "r" * (megabytes * 1_000_000)


class Unlucky(LookupError):
    """A user's error the retry-policy tests name."""


def snooze_once(marker: str) -> str:
    """Registered by tests with ``process=True``: snoozes while ``marker`` is
    missing (creating it), then succeeds."""
    if not os.path.exists(marker):
        open(marker, "w").close()
        raise conveyor.Snooze(0.05)
    return "woke"


def raise_unlucky() -> None:
    """Registered by tests with ``process=True``: raises :class:`Unlucky`."""
    raise Unlucky("not today")


def retry_later(delay: float) -> None:
    """Registered by tests with ``process=True``: asks for a retry after ``delay``."""
    raise conveyor.Retry(delay=delay, reason="the mail server said later")


def pid_of_process() -> int:
    """Registered by tests with ``process=True``: the handler process's pid."""
    return os.getpid()


def sleep_then_pid(seconds: float) -> int:
    """Registered by tests with ``process=True``: sleeps, then its pid."""
    time.sleep(seconds)
    return os.getpid()


def exit_then_pid(code: int) -> int:
    """Registered by tests with ``process=True``: ``sys.exit(code)``, which a
    handler process reports as the attempt's error and survives."""
    raise SystemExit(code)
