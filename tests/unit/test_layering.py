"""The package's floors as DESIGN.md draws them: each imports only what stands below it.

Read from the source (every ``import`` and ``from … import``, lazy ones inside functions
included), so an upward import fails here before it can make an import cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import sparkfold

PACKAGE = Path(sparkfold.__file__).parent


def imported_modules(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
    return found


# DESIGN.md's floors, top to bottom; each may use only what stands below it. engines/ and api/ share a
# floor and never import each other (api/ talks HTTP to an engine server). Packages DESIGN does not
# draw (fleet/, image/, weights/, evals/, the small shared modules) are not on a floor.
CLI = ("sparkfold.cli", "sparkfold.commands")
ABOVE_SERVERS = (*CLI, "sparkfold.node")
ABOVE_SHARED = (*ABOVE_SERVERS, "sparkfold.engines", "sparkfold.api")
ABOVE_SCHEMAS = (*ABOVE_SHARED, "sparkfold.glm", "sparkfold.bench")
FLOORS: dict[str, tuple[str, ...]] = {
    "node": CLI,
    "engines": (*ABOVE_SERVERS, "sparkfold.api"),
    "api": (*ABOVE_SERVERS, "sparkfold.engines"),
    "glm": ABOVE_SHARED,
    "bench": ABOVE_SHARED,
    "protocol.py": ABOVE_SCHEMAS,
    "config.py": ABOVE_SCHEMAS,
}


def sources(layer: str) -> list[Path]:
    path = PACKAGE / layer
    return [path] if path.is_file() else sorted(path.rglob("*.py"))


@pytest.mark.parametrize(("layer", "above"), FLOORS.items())
def test_a_floor_never_imports_one_above_it(layer: str, above: tuple[str, ...]) -> None:
    upward = {
        f"{path.relative_to(PACKAGE)}: {name}"
        for path in sources(layer)
        for name in imported_modules(path)
        if any(name == floor or name.startswith(floor + ".") for floor in above)
    }
    assert not upward, sorted(upward)


def test_every_floor_is_there() -> None:
    """A floor renamed or moved would make its row above pass by finding no files."""
    assert all(sources(layer) for layer in FLOORS)
