"""Shared fixtures: paths of the repository, a scripted engine on a loopback port; the process guard
(tests/process_guard.py: a session that leaves a process of its own behind fails)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from tests.process_guard import (  # noqa: F401  (hooks: pytest finds them in this conftest)
    pytest_configure,
    pytest_runtest_setup,
    pytest_runtest_teardown,
    pytest_sessionfinish,
)

if TYPE_CHECKING:
    from tests.fakes.scripted_engine import ScriptedEngine, ServerThread

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture
def engine() -> Iterator[tuple[ScriptedEngine, ServerThread]]:
    """A scripted engine (tests/fakes/scripted_engine.py) serving on a free loopback port.

    A folder's own ``engine`` fixture (a CPU model, a GPU engine) replaces it there.
    """
    from tests.fakes.scripted_engine import ScriptedEngine, ServerThread  # only where a test asks

    fake = ScriptedEngine()
    with ServerThread(fake) as server:
        yield fake, server
