"""The two-node testbed, built once per session (``playbooks/testbed.yml``), and site.yml runs on it.

Needs root, ``systemd-nspawn`` and ``debootstrap``; skipped elsewhere. The pair is torn down at the
end unless ``SPARKFOLD_TESTBED_KEEP=1``. Before its first converge, while the pair is as fresh as a
new one, ``site.yml --check --diff`` runs on it once (``fresh_check``; ``test_fresh_check.py``).
Unless ``SPARKFOLD_UPGRADE_DRILL=0``, the previous release then converges it from its own tree
(``previous``), and today's first converge is an upgrade of a serving pair (``upgrade``;
``test_upgrade.py``).
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from listing import Checked, Listing, control_listing, node_listing
from testbed_kit import (
    HEAD,
    REPO,
    WORKER,
    Run,
    chat_answers,
    installed_version,
    play,
    ssh,
    starts_since,
    unit,
    wait_for,
)
from tests.releases import previous_release, write_tree
from upgrade_drill import Previous, Streams, Upgrade


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
def previous(fresh_check: Checked, artifacts: Path) -> Previous | str:
    """The previous release's site.yml on the pair, from its tree and with its testbed inventory,
    after the fresh pair's check run; why not, when the drill is off
    (``SPARKFOLD_UPGRADE_DRILL=0``) or the clone holds no release (tests/releases.py)."""
    if os.environ.get("SPARKFOLD_UPGRADE_DRILL") == "0":
        return "the upgrade drill is off (SPARKFOLD_UPGRADE_DRILL=0)"
    release = previous_release(REPO)
    if isinstance(release, str):
        return release
    tree = write_tree(REPO, release, artifacts / f"sparkfold-v{release.version}")
    # This checkout's .cache (the control host's wheelhouse, credentials, the testbed's key), as an
    # upgrade in place keeps it.
    (tree / ".cache").symlink_to(REPO / ".cache")
    run = play(artifacts / "previous-release", "site.yml", root=tree, env=release.env).must_succeed()
    return Previous(release, tree, run, {node: installed_version(node) for node in (HEAD, WORKER)})


@pytest.fixture(scope="session")
def upgrade(previous: Previous | str, artifacts: Path) -> Upgrade:
    """Today's site.yml on the pair, once per session: over the previous release, serving, with
    streams open through the gateway while it restarts (upgrade_drill.py); on a fresh pair when the
    clone holds no release."""
    if isinstance(previous, str):
        return Upgrade(play(artifacts / "converge-1", "site.yml"), skipped=previous)
    api_key = read_api_key()
    wait_for("the previous release to serve", lambda: chat_answers(api_key), timeout_s=600, every_s=5)
    streams = Streams(api_key)
    streamer = threading.Thread(target=streams.run, daemon=True)
    streamer.start()
    run = play(artifacts / "converge-1", "site.yml", on_event=streams.on_event)
    streams.stop.set()
    streams.go.set()
    streamer.join(180)  # a stream's lines come within httpx's 120 s, or it ends
    units = {"worker engine": unit(WORKER, "sparkfold-engine"), "head engine": unit(HEAD, "sparkfold-engine")}
    starts = {
        "head engine": starts_since(HEAD, "sparkfold-engine", run.started_at),
        "api": starts_since(HEAD, "sparkfold-api", run.started_at),
    }
    return Upgrade(run, previous, "", streams.ran, streamer.is_alive(), units, starts)


@pytest.fixture(scope="session")
def first_converge(upgrade: Upgrade) -> Run:
    """Today's first site.yml on the pair: the upgrade (or a fresh pair's first converge)."""
    return upgrade.run


@pytest.fixture
def converge(first_converge: Run, artifacts: Path, request: pytest.FixtureRequest) -> Callable[..., Run]:
    first_converge.must_succeed()
    counter = iter(range(1000))

    def run(**kwargs: Any) -> Run:
        return play(artifacts / f"{request.node.name}-{next(counter)}", "site.yml", **kwargs)

    return run


def read_api_key() -> str:
    """The key the service stage generated for the testbed on the control host."""
    return (REPO / ".cache/control/credentials/testbed/api-key").read_text().strip()


@pytest.fixture(scope="session")
def api_key() -> str:
    return read_api_key()
