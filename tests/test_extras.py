"""A module of an extra imported without the extra installed: one clear
ConfigurationError that names the extra to install."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.cli_harness import ROOT

PROBE = """
import sys
sys.modules[{missing!r}] = None  # as if it were not installed
try:
    import {module}
except Exception as exc:
    print(type(exc).__name__, exc)
else:
    print("imported")
"""


@pytest.mark.parametrize(
    ("module", "missing", "extra"),
    [
        ("conveyor.tracing", "opentelemetry", "otel"),
        ("conveyor.metrics", "prometheus_client", "metrics"),
        ("conveyor.dashboard", "starlette", "dashboard"),
        ("conveyor.dashboard", "jinja2", "dashboard"),
    ],
)
def test_a_missing_extra_is_named(module: str, missing: str, extra: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(module=module, missing=missing)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.startswith("ConfigurationError"), done.stdout + done.stderr
    assert f"pip install 'conveyor[{extra}]'" in done.stdout
