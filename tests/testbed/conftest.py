"""The two-node testbed, built once per session (``playbooks/testbed.yml``), and site.yml runs on it.

Needs root, ``systemd-nspawn`` and ``debootstrap``; skipped elsewhere. The pair is torn down at the
end unless ``SPARKFOLD_TESTBED_KEEP=1``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from testbed_kit import REPO, Run, play


@pytest.fixture(scope="session")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("runner")


@pytest.fixture(scope="session")
def testbed(artifacts: Path) -> Iterator[None]:
    if os.geteuid() != 0 or not (shutil.which("systemd-nspawn") and shutil.which("debootstrap")):
        pytest.skip("the testbed needs root, systemd-nspawn and debootstrap")
    play(artifacts / "testbed", "playbooks/testbed.yml").must_succeed()
    yield
    if os.environ.get("SPARKFOLD_TESTBED_KEEP") != "1":
        play(artifacts / "teardown", "playbooks/teardown.yml").must_succeed()


@pytest.fixture(scope="session")
def first_converge(testbed: None, artifacts: Path) -> Run:
    """site.yml on the pair, once per session (a fresh pair in CI)."""
    return play(artifacts / "converge-1", "site.yml")


@pytest.fixture
def converge(first_converge: Run, artifacts: Path, request: pytest.FixtureRequest) -> Callable[..., Run]:
    first_converge.must_succeed()
    counter = iter(range(1000))

    def run(**kwargs: Any) -> Run:
        return play(artifacts / f"{request.node.name}-{next(counter)}", "site.yml", **kwargs)

    return run


@pytest.fixture(scope="session")
def api_key() -> str:
    return (REPO / ".cache/control/credentials/testbed/api-key").read_text().strip()
