"""The package's layers (``../shared/DESIGN.md``): engines/ never imports node/, api/ never engines/.

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


@pytest.mark.parametrize(("layer", "above"), [("engines", "sparkfold.node"), ("api", "sparkfold.engines")])
def test_a_layer_never_imports_the_one_above(layer: str, above: str) -> None:
    upward = {
        f"{path.relative_to(PACKAGE)}: {name}"
        for path in sorted((PACKAGE / layer).rglob("*.py"))
        for name in imported_modules(path)
        if name == above or name.startswith(above + ".")
    }
    assert not upward, sorted(upward)
