"""The examples are runnable: each is executed as a user would run it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_example(name: str, **env: str) -> list[str]:
    """Run ``examples/NAME`` with extra environment; its output lines (it must succeed)."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_quickstart_prints_its_results(pg_url: str, schema: str) -> None:
    lines = run_example("quickstart.py", CONVEYOR_URL=pg_url, CONVEYOR_SCHEMA=schema)
    assert lines == ["hello, world", "DURABLE"]


def test_order_fulfilment_runs_every_step_with_its_retry_and_reminder(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'orders.db'}"
    lines = run_example("order_fulfilment.py", CONVEYOR_URL=url, REMIND_AFTER="0.3")
    assert lines == [
        "order 42: reserved book, lamp",
        "order 42: charged 19.99",
        "order 42: shipped",
        "order 42: asked for a review",
        "result: {'order_id': 42, 'status': 'complete'}",
        "steps: Reserve:succeeded -> Charge:failed -> Charge:succeeded -> Ship:succeeded"
        " -> Remind:succeeded",
    ]


def test_coroutine_fanout_adds_up_its_children_then_waits_for_the_approval(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'quotes.db'}"
    lines = run_example("coroutine_fanout.py", CONVEYOR_URL=url)
    assert lines == [
        "quote 7: pricing 3 lines",
        "quote 7: priced book x2, lamp x1, mug x4: subtotal 86.99",
        "quote 7: waiting for approval",
        "webhook: alice approves quote 7",
        "quote 7: approved by alice",
        "result: {'quote': 7, 'total_cents': 8699}",
        "children: book=2500:succeeded, lamp=3499:succeeded, mug=2700:succeeded",
    ]


def test_schedules_declares_a_cron_and_an_interval_schedule() -> None:
    lines = run_example("schedules.py", CONVEYOR_URL="memory://schedules-example")
    assert lines == [
        "nightly_report: cron '30 2 * * *' in Europe/Paris",
        "refresh_cache: every 300s",
    ]


def test_thumbnails_reports_every_member_once_and_chains_a_result(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'thumbs.db'}"
    lines = run_example("thumbnails.py", CONVEYOR_URL=url)
    assert lines == [
        "report: 3 resized (15000 bytes); failed: ['cannot read c.bmp']",
        "chain: published 9000 bytes",
    ]
