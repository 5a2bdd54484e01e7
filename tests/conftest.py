"""Shared fixtures: paths of the repository and its example files; the process guard
(tests/process_guard.py: a session that leaves a process of its own behind fails)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.process_guard import (  # noqa: F401  (hooks: pytest finds them in this conftest)
    pytest_configure,
    pytest_runtest_setup,
    pytest_runtest_teardown,
    pytest_sessionfinish,
)

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO
