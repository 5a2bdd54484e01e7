"""Every module that declares ``__all__`` keeps it true (STYLE rule 9; ruff RUF022 keeps it sorted)."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import sparkfold

# modules whose import needs an optional heavy extra that may be absent (none today: the GPU
# engine's package imports exllamav3 only when the engine starts)
OPTIONAL: tuple[str, ...] = ()


def modules() -> list[str]:
    names = [sparkfold.__name__]
    for info in pkgutil.walk_packages(sparkfold.__path__, prefix=f"{sparkfold.__name__}."):
        if not info.name.startswith(OPTIONAL) and "__main__" not in info.name:
            names.append(info.name)
    return names


@pytest.mark.parametrize("name", modules())
def test_all_names_what_the_module_has(name: str) -> None:
    module = importlib.import_module(name)
    exported = getattr(module, "__all__", None)
    if exported is None:
        return
    missing = [item for item in exported if not hasattr(module, item)]
    assert not missing, f"{name}.__all__ names what it lacks: {missing}"
