"""The documentation site builds in strict mode, shows the recipe files as
they are tested and the whole public API, and its strict gate holds: a
broken link, a broken anchor, a missing snippet or a page left out of the nav
fails the build, and so does a public object without a docstring (checked
here, on the same static analysis the reference is rendered from)."""

from __future__ import annotations

import html
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import griffe
import pytest

import conveyor
import conveyor.testing

ROOT = Path(__file__).resolve().parents[1]
MKDOCS_BUILD = [sys.executable, "-m", "mkdocs", "build", "--strict"]
SNIPPET = re.compile(r'^--8<-- "([^"]+)"$', re.MULTILINE)


def mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*MKDOCS_BUILD, "--config-file", str(config), "--site-dir", str(site)],
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def page_text(page: Path) -> str:
    """A built page as text: tags removed, entities decoded (code blocks
    keep their text exactly, highlighting only wraps it in tags)."""
    return html.unescape(re.sub(r"<[^>]+>", "", page.read_text()))


@pytest.mark.slow
def test_site_builds_strict_with_the_tested_recipes_and_the_public_api(tmp_path: Path) -> None:
    site = tmp_path / "site"
    done = mkdocs_build(ROOT / "mkdocs.yml", site)
    assert done.returncode == 0, done.stderr

    reference = (site / "reference" / "index.html").read_text()
    for name in conveyor.__all__:
        assert f'id="conveyor.{name}"' in reference, name
    for name in conveyor.testing.__all__:
        assert f'id="conveyor.testing.{name}"' in reference, name
    assert "A connection to one store" in page_text(site / "reference" / "index.html")

    recipes = page_text(site / "recipes" / "index.html")
    included = SNIPPET.findall((ROOT / "docs" / "recipes.md").read_text())
    assert "examples/recipes/fastapi_app.py" in included
    assert "examples/recipes/conveyor-worker.service" in included
    for path in included:
        # Every line of the file as it is tested, in order, nothing added.
        assert (ROOT / path).read_text().strip() in recipes, path
    assert "--8<--" not in recipes


def site_copy(tmp_path: Path) -> Path:
    """A copy of the docs and mkdocs.yml, with the code they include linked in."""
    copy = tmp_path / "copy"
    copy.mkdir()
    shutil.copy(ROOT / "mkdocs.yml", copy / "mkdocs.yml")
    shutil.copytree(ROOT / "docs", copy / "docs")
    for linked in ("src", "examples"):
        (copy / linked).symlink_to(ROOT / linked, target_is_directory=True)
    return copy


BREAKAGES = {
    "link to a missing page": ("recipes.md", "See [the missing page](missing.md).", "missing.md"),
    "missing anchor": ("index.md", "See [nothing](guarantees.md#no-such-part).", "no-such-part"),
    "missing snippet file": ("recipes.md", '--8<-- "examples/recipes/missing.py"', "missing.py"),
    "page outside the nav": ("extra.md", "# Extra", "extra.md"),
}


@pytest.mark.slow
@pytest.mark.parametrize("breakage", sorted(BREAKAGES))
def test_strict_build_fails_on_a_broken_doc(tmp_path: Path, breakage: str) -> None:
    page, line, named = BREAKAGES[breakage]
    copy = site_copy(tmp_path)
    target = copy / "docs" / page
    existing = target.read_text() if target.exists() else ""
    target.write_text(f"{existing}\n{line}\n")
    done = mkdocs_build(copy / "mkdocs.yml", tmp_path / "site")
    # The copy is the real site (which builds: see the test above) but for
    # this one line, and the failure names it.
    assert done.returncode != 0
    assert named in done.stderr, done.stderr


def public_objects() -> list[griffe.Object]:
    """What the reference renders, as griffe (mkdocstrings' loader) sees it:
    the exports of ``conveyor`` and ``conveyor.testing``, and the public
    members of the exported classes."""
    package = griffe.load("conveyor", search_paths=[str(ROOT / "src")])
    found: dict[str, griffe.Object] = {}
    pending: list[griffe.Object | griffe.Alias] = []
    for module in (package, package["testing"]):
        pending += [module[name] for name in module.exports or ()]
    while pending:
        item = pending.pop()
        target = item.final_target if isinstance(item, griffe.Alias) else item
        if target.path in found:
            continue
        found[target.path] = target
        if target.is_class:
            pending += [m for n, m in target.members.items() if not n.startswith("_")]
    return list(found.values())


def test_every_public_class_function_and_property_has_a_docstring() -> None:
    """Fields and enum members are described by their class's docstring; any
    other public object must say what it does."""
    missing = sorted(
        obj.path
        for obj in public_objects()
        if not obj.docstring and (obj.is_class or obj.is_function or "property" in obj.labels)
    )
    assert missing == []
