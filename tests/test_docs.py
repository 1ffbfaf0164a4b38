"""Every docstring example in the package runs and gives what it shows, and every relative link
in the README and docs/ leads somewhere."""

from __future__ import annotations

import doctest
import importlib
import pkgutil
import re
from pathlib import Path

import pytest

import tunehub

MODULES = sorted(
    m.name
    for m in pkgutil.walk_packages(tunehub.__path__, "tunehub.")
    if ".migrations" not in m.name and m.name != "tunehub.workers.sandbox"
)


@pytest.mark.parametrize("module", MODULES)
def test_docstring_examples_run(module: str) -> None:
    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0


def test_the_examples_cover_the_main_types() -> None:
    attempted = {
        name: doctest.testmod(importlib.import_module(name)).attempted
        for name in ("tunehub.core.workload", "tunehub.core.config", "tunehub.kernels.space")
    }
    assert all(attempted.values()), attempted


ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted(
    [ROOT / "README.md", ROOT / "benchmarks" / "README.md", *(ROOT / "docs").glob("*.md")]
)
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_BLOCK = re.compile(r"^```.*?^```", re.S | re.M)
_CODE = re.compile(r"^```.*?^```|`[^`\n]*`", re.S | re.M)


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors in ``path``: lowercased, punctuation dropped, spaces to '-'."""
    text = _BLOCK.sub("", path.read_text())
    return {
        re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        for line in text.splitlines()
        if line.startswith("#")
    }


@pytest.mark.parametrize(
    "doc", [d for d in DOCS if d.exists()], ids=lambda d: str(d.relative_to(ROOT))
)
def test_relative_links_resolve(doc: Path) -> None:
    broken = []
    for target in _LINK.findall(_CODE.sub("", doc.read_text())):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        path = (doc.parent / file).resolve() if file else doc
        if not path.exists() or (anchor and path.suffix == ".md" and anchor not in _anchors(path)):
            broken.append(target)
    assert not broken, f"{doc.relative_to(ROOT)}: broken links {broken}"
