"""The import contracts in pyproject.toml hold where they should, and break
where they must. ``lint-imports`` runs on a copy of the source tree: it
passes as it is, and fails, naming the contract and the import, once a
module outside ``conveyor.backends`` imports an engine (every top-level
module and package of conveyor is tried: the contract names them by a
wildcard, so a new one is in it too), a driver is imported outside its
engine, the dashboard or the CLI imports anything of the backends (the
records they read are in ``conveyor.records``), or a module of the dashboard imports one above
it. A grep checks that neither the dashboard nor the CLI reaches past the
client to a backend."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ENGINES_CONTRACT = "Only conveyor.backends names an engine"
ROOT_CONTRACT = "The package's root names no engine"
DRIVERS_CONTRACT = "Only the engines import the database drivers"
ENGINE_IMPORT = "import conveyor.backends.postgres.backend  # noqa: F401\n"


def _lint_imports() -> str:
    found = shutil.which("lint-imports")
    if found is None:
        pytest.skip("lint-imports is not installed")
    return found


def _copy(tmp_path: Path) -> Path:
    """A copy of the source tree and the configuration, in ``tmp_path``."""
    shutil.copytree(ROOT / "src", tmp_path / "src", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def _run(copy: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(copy / "src")}
    return subprocess.run(
        [_lint_imports(), "--no-cache", "--config", str(copy / "pyproject.toml")],
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _outside_backends(package: Path) -> list[Path]:
    """The file of each top-level module and package of conveyor but backends
    (a package's ``__init__.py``)."""
    found = []
    for entry in sorted(package.iterdir()):
        if entry.name == "backends" or entry.name.startswith(("_", ".")):
            continue
        if entry.is_dir() and (entry / "__init__.py").exists():
            found.append(entry / "__init__.py")
        elif entry.suffix == ".py":
            found.append(entry)
    return found


def _append(path: Path, line: str) -> None:
    path.write_text(path.read_text() + line)


def test_the_contracts_hold_on_the_tree_as_it_is(tmp_path: Path) -> None:
    result = _run(_copy(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    for contract in (ENGINES_CONTRACT, ROOT_CONTRACT, DRIVERS_CONTRACT):
        assert contract in " ".join(result.stdout.split())


def test_an_engine_imported_from_metrics_breaks_the_engines_contract(tmp_path: Path) -> None:
    copy = _copy(tmp_path)
    _append(copy / "src" / "conveyor" / "metrics.py", ENGINE_IMPORT)
    result = _run(copy)
    assert result.returncode != 0
    text = " ".join(result.stdout.split())
    assert "no other module imports postgres, sqlite, memory or redis BROKEN" in text
    assert "conveyor.metrics -> conveyor.backends.postgres.backend" in text


def test_every_module_outside_the_backends_is_fenced(tmp_path: Path) -> None:
    """An engine imported from each top-level module or package (and the
    package's root) is each a broken import of its contract."""
    copy = _copy(tmp_path)
    package = copy / "src" / "conveyor"
    modules = _outside_backends(package)
    assert len(modules) > 20  # the walk found the tree
    for path in [*modules, package / "__init__.py"]:
        _append(path, ENGINE_IMPORT)
    result = _run(copy)
    assert result.returncode != 0
    text = " ".join(result.stdout.split())
    assert ENGINES_CONTRACT in text and f"{ROOT_CONTRACT} BROKEN" in text
    for path in modules:
        name = "conveyor." + (path.parent.name if path.name == "__init__.py" else path.stem)
        assert f"{name} -> conveyor.backends.postgres.backend" in text, name
    assert "conveyor -> conveyor.backends.postgres.backend" in text


def test_a_driver_imported_outside_its_engine_breaks_the_drivers_contract(
    tmp_path: Path,
) -> None:
    copy = _copy(tmp_path)
    _append(copy / "src" / "conveyor" / "backends" / "protocol.py", "import sqlite3  # noqa\n")
    result = _run(copy)
    assert result.returncode != 0
    text = " ".join(result.stdout.split())
    assert f"{DRIVERS_CONTRACT} BROKEN" in text
    assert "conveyor.backends.protocol -> sqlite3" in text


CLIENT_CONTRACT = "The dashboard and the CLI read and act through the Client"
PAST_THE_CLIENT = (".backend()", "inspector_of", "make_backend", "read_overview", "store_now")
"""What reaches past the client to a backend: none of it in the dashboard or the CLI."""


def test_the_dashboard_and_the_cli_reach_no_backend_past_the_client() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for package in ("dashboard", "cli")
        for path in sorted((ROOT / "src" / "conveyor" / package).rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if any(word in line for word in PAST_THE_CLIENT)
    ]
    assert found == []


def test_reaching_past_the_client_or_up_the_dashboard_breaks_a_contract(
    tmp_path: Path,
) -> None:
    """The CLI importing the backends' package, the dashboard one of their
    modules, and the dashboard's shared state importing its wiring (the
    circle it once made, through a type-only import) each break one."""
    copy = _copy(tmp_path)
    _append(
        copy / "src" / "conveyor" / "dashboard" / "state.py",
        "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
        "    from conveyor.dashboard.app import create_app  # noqa\n",
    )
    _append(copy / "src" / "conveyor" / "cli" / "top.py", "from conveyor import backends  # noqa\n")
    _append(
        copy / "src" / "conveyor" / "dashboard" / "pages.py",
        "from conveyor.backends.stored import SQL_TEXTS  # noqa\n",
    )
    result = _run(copy)
    assert result.returncode != 0
    text = " ".join(result.stdout.split())
    assert "are in conveyor.records) BROKEN" in text
    assert "conveyor.cli.top -> conveyor.backends" in text
    assert "conveyor.dashboard.pages -> conveyor.backends.stored" in text
    assert "The dashboard's modules import downwards only" in text
    assert "conveyor.dashboard.state -> conveyor.dashboard.app" in text
