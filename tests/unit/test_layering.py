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


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_package_modules(path: Path, modules: set[str]) -> set[str]:
    """The package's modules ``path`` imports: ``from a import b`` names ``a.b`` where that is a
    module, ``a`` otherwise."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                found.add(
                    f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in modules else node.module
                )
    return found & modules


def test_no_modules_import_each_other_round_a_circle() -> None:
    """Within a floor too: no module reaches itself through the imports of the modules it
    imports, ``TYPE_CHECKING`` and lazy imports included (a circle held open by an import that
    only a type checker runs is still a circle; the weights errors and their report were one).
    A package's ``__init__`` re-exporting its own modules is not a circle."""
    paths = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    modules = set(paths)
    graph = {
        name: {
            other
            for other in imported_package_modules(path, modules)
            if other != name and not (path.name == "__init__.py" and other.startswith(name + "."))
        }
        for name, path in paths.items()
    }
    circles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    trail: list[str] = []

    def visit(name: str) -> None:
        state[name] = 1
        trail.append(name)
        for other in sorted(graph[name]):
            if state.get(other) == 1:
                circles.append([*trail[trail.index(other) :], other])
            elif other not in state:
                visit(other)
        trail.pop()
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name)
    assert not circles, [" -> ".join(circle) for circle in circles]
