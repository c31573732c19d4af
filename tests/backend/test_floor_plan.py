"""The four engines share one floor plan: every engine package has a module
per section of the backend protocol, named alike, and each of its other
modules is infrastructure of that engine alone, listed here; the backend
module of each wires every section. A reader who knows
where claims live in one engine finds them in every engine; a module added
to an engine without a place in the plan fails here."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import conveyor

BACKENDS = Path(conveyor.__file__).resolve().parent / "backends"

ENGINES = ("postgres", "sqlite", "memory", "redis")

SECTIONS = {
    "backend",
    "schema",
    "enqueue",
    "attempts",
    "messages",
    "controls",
    "flow",
    "workers",
    "maintenance",
    "reads",
    "rows",
}
"""What every engine has: the backend class, then one module per section
(docs/architecture.md, "The engines' floor plan")."""

MIXINS = SECTIONS - {"backend", "rows"}
"""The sections whose behaviour the backend is made of (mixins of its class,
or functions of its store); rows are pure conversions, the backend module
the wiring itself."""


def modules(engine: str) -> set[str]:
    return {path.stem for path in (BACKENDS / engine).glob("*.py") if path.stem != "__init__"}


def extras_documented() -> dict[str, set[str]]:
    """Each engine's own modules as docs/architecture.md lists them."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "architecture.md").read_text()
    section = text.split("## The engines' floor plan", 1)[1].split("\n## ", 1)[0]
    found: dict[str, set[str]] = {}
    for line in section.splitlines():
        for engine in ENGINES:
            prefix = f"- {engine}:"
            if line.lower().startswith(prefix):
                rest = line[len(prefix) :]
                found[engine] = {
                    word.strip("`., ") for word in rest.split("`")[1::2] if word.strip()
                }
    return found


@pytest.mark.parametrize("engine", ENGINES)
def test_every_engine_has_every_section(engine: str) -> None:
    assert modules(engine) >= SECTIONS, sorted(SECTIONS - modules(engine))


@pytest.mark.parametrize("engine", ENGINES)
def test_an_engine_s_other_modules_are_the_documented_infrastructure(engine: str) -> None:
    assert modules(engine) - SECTIONS == extras_documented()[engine]


def wired_sections(engine: str) -> set[str]:
    """The modules of the engine that its backend.py imports from."""
    tree = ast.parse((BACKENDS / engine / "backend.py").read_text())
    package = f"conveyor.backends.{engine}"
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == package:
                found.update(alias.name for alias in node.names)
            elif node.module.startswith(package + "."):
                found.add(node.module.rsplit(".", 1)[-1])
    return found


@pytest.mark.parametrize("engine", ENGINES)
def test_the_backend_wires_every_section(engine: str) -> None:
    wired = wired_sections(engine)
    assert wired >= MIXINS, sorted(MIXINS - wired)
