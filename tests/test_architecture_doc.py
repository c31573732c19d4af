"""docs/architecture.md's table of layers is the import contract's: the same
layers, in the same order, each naming the same modules."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ROW = re.compile(r"^\| (\d+) \| ([^|]+) \|", re.MULTILINE)


def contract_layers() -> list[set[str]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    (layers,) = [c["layers"] for c in contracts if c["name"].startswith("Layers:")]
    return [{name.strip() for name in layer.split("|")} for layer in layers]


def documented_layers() -> list[set[str]]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    rows = ROW.findall(section)
    assert [int(number) for number, _ in rows] == list(range(1, len(rows) + 1))
    return [set(re.findall(r"`([\w.]+)`", modules)) for _, modules in rows]


def test_the_documented_layers_are_the_contract_s() -> None:
    assert documented_layers() == contract_layers()
