"""Fixtures of the Ansible tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from local_head import render_example


@pytest.fixture(scope="session")
def example_render(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example inventory rendered once per session with no overrides (one folder per host).

    Read-only for the tests that share it; a test with ``-e`` overrides renders its own.
    """
    return render_example(repo, tmp_path_factory.mktemp("example-render"))
