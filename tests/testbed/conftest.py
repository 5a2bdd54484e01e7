"""The two-node testbed, built once per session (``playbooks/testbed.yml``), and site.yml runs on it.

Needs root, ``systemd-nspawn`` and ``debootstrap``; skipped elsewhere. The pair is torn down at the
end unless ``SPARKFOLD_TESTBED_KEEP=1``. Before its first converge, while the pair is as fresh as a
new one, ``site.yml --check --diff`` runs on it once (``fresh_check``; ``test_fresh_check.py``).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from listing import Checked, Listing, control_listing, node_listing
from testbed_kit import HEAD, REPO, WORKER, Run, play, ssh


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
def fresh_check(testbed: None, artifacts: Path) -> Checked:
    """``site.yml --check --diff`` on the pair before anything converged it, with listings of the
    nodes and the control host taken before and after the run. On a pair converged before this
    session (a kept testbed) it does not run: ``stale`` says so."""
    addresses = {"sftb-head": HEAD, "sftb-worker": WORKER}
    probe = "test -e /etc/sparkfold && echo converged"
    converged = [name for name, address in addresses.items() if ssh(address, probe, check=False)]
    if converged:
        return Checked(None, {}, {}, f"{', '.join(converged)} converged before this session")

    def listings() -> dict[str, Listing]:
        nodes = {name: node_listing(address) for name, address in addresses.items()}
        return nodes | {"control": control_listing()}

    before = listings()
    run = play(artifacts / "fresh-check", "site.yml", check=True, diff=True)
    return Checked(run, before, listings())


@pytest.fixture(scope="session")
def first_converge(fresh_check: Checked, artifacts: Path) -> Run:
    """site.yml on the pair, once per session (a fresh pair in CI), after the fresh pair's check run."""
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
