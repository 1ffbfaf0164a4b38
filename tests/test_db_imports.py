"""The modules of ``tunehub.db`` import one another in one direction (issue 26: ``common`` and
``store`` imported each other, one of them inside a function to dodge the cycle), and nothing
below the command line imports it."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.live import REPO

PACKAGE = REPO / "tunehub"


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path) -> set[str]:
    """Every module ``path`` imports, wherever the import is: at the top, in a function, or
    under ``TYPE_CHECKING``; ``from a import b`` names both ``a`` and ``a.b``."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_the_store_modules_import_one_another_without_a_cycle() -> None:
    files = {module_name(p): p for p in (PACKAGE / "db").glob("*.py") if p.name != "__init__.py"}
    edges = {name: imported(path) & files.keys() for name, path in files.items()}
    assert "tunehub.db.store" in edges["tunehub.db.common"]  # the helpers build on the contract
    assert not edges["tunehub.db.store"], "the contract imports no other store module"

    def cycle_from(start: str, path: tuple[str, ...]) -> tuple[str, ...] | None:
        for nxt in sorted(edges[path[-1]]):
            if nxt == start:
                return (*path, nxt)
            if nxt not in path:
                found = cycle_from(start, (*path, nxt))
                if found:
                    return found
        return None

    cycles = [c for name in sorted(edges) if (c := cycle_from(name, (name,)))]
    assert not cycles, " -> ".join(cycles[0])


def test_nothing_below_the_command_line_imports_it() -> None:
    for path in PACKAGE.rglob("*.py"):
        if "cli" in path.relative_to(PACKAGE).parts:
            continue
        names = imported(path)
        assert "tunehub.cli" not in names, path
        assert not {n for n in names if n.startswith("tunehub.cli.")}, path
