"""Security basics that hold by construction, checked on the source itself.

- No module of conveyor imports pickle, marshal, shelve or dill: stored and
  transmitted data is strict JSON only (a process handler's pipe carries
  JSON text).
- No module builds SQL by formatting strings: ruff's S608 rule runs on
  ``src`` in the test line, and here no ``execute`` call in conveyor takes
  an f-string, a ``%``-formatted or a concatenated string.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "conveyor"
UNSAFE_MODULES = {"pickle", "marshal", "shelve", "dill", "cloudpickle"}


def _modules() -> list[tuple[Path, ast.Module]]:
    return [(path, ast.parse(path.read_text(), str(path))) for path in SRC.rglob("*.py")]


def test_no_module_imports_a_serialiser_that_runs_code() -> None:
    found = []
    for path, tree in _modules():
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            found += [f"{path.name}: {n}" for n in names if n.split(".")[0] in UNSAFE_MODULES]
    assert found == []


def test_no_statement_is_built_by_string_formatting() -> None:
    found = []
    for path, tree in _modules():
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            if node.func.attr not in {"execute", "executemany", "executescript"} or not node.args:
                continue
            statement = node.args[0]
            formatted = isinstance(statement, ast.JoinedStr) or (
                isinstance(statement, ast.BinOp) and isinstance(statement.op, ast.Mod | ast.Add)
            )
            if formatted:
                found.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert found == []
