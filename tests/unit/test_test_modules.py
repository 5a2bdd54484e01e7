"""`make test` (the README's command) runs one pytest over all of tests/: pytest imports a test
module outside a package by its file name alone, so two such modules with one name stop the whole
collection ("import file mismatch") before any test runs."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_no_two_top_level_test_modules_share_a_name() -> None:
    places: defaultdict[str, list[str]] = defaultdict(list)
    for module in TESTS.rglob("test_*.py"):
        if not (module.parent / "__init__.py").exists():
            places[module.name].append(str(module.relative_to(TESTS)))
    assert {name: where for name, where in places.items() if len(where) > 1} == {}


def test_no_test_module_imports_a_conftest_by_name() -> None:
    # `from conftest import …` takes whichever directory's conftest pytest imported first: the
    # weights tests failed to collect beside tests/unit/node. Shared helpers live in named modules.
    importers = [
        str(module.relative_to(TESTS))
        for module in TESTS.rglob("*.py")
        if re.search(r"^\s*(from conftest import|import conftest\b)", module.read_text(), re.MULTILINE)
    ]
    assert importers == []
