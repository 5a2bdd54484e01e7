"""``site.yml --check --diff`` on a fresh pair: it passes, says what a first run would do, writes nothing.

A pair of its own beside the shared one (``inventory/testbed-check``: the ``sfck-*`` names, bridge
``sfck-br0``): two machines booted from the cached node image and never converged, so the check run
meets what a first run meets (no python3-apt, rsync, iproute2, venv, settings or units). Cheap: no
converge and no model load. The converged pair's check run is ``test_pair.py``'s.

What counts as written: every path, size and mtime of each node's filesystem outside the folders
a running system writes by itself, and the control host's ``.cache/control`` (wheelhouse,
manifests, credentials, the curl line) plus the build folders setuptools would leave in the checkout.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from testbed_kit import ADMIN, REPO, Run, play, ssh

pytestmark = [pytest.mark.testbed, pytest.mark.netns, pytest.mark.timeout(1800)]

INVENTORY = "inventory/testbed-check"
NODES = {"sfck-head": "198.51.100.66", "sfck-worker": "198.51.100.67"}
# Written by the running system itself (kernel, journald, systemd's state, sockets, scratch files).
SYSTEM_WRITES = ["/proc", "/sys", "/run", "/tmp", "/var/log", "/var/lib/systemd"]
# Ansible's own working folder (remote_tmp, ~/.ansible/tmp of the login): the first Ansible run of
# any kind makes it, stages module files in it and removes them. Not sparkfold's doing: the login's
# home is compared without it (and without the mtime its creation gives the home folder).
HOME = f"/home/{ADMIN}"
CONTROL = [REPO / ".cache/control", REPO / "build", REPO / "runtime/sparkfold.egg-info"]
Listings = dict[str, dict[str, str]]  # node name (or "control") -> path -> "size mtime"
Checked = tuple[Run, Listings, Listings]  # the run, and the listings before and after it


def node_listing(address: str) -> dict[str, str]:
    """Every path on the node's root filesystem (outside SYSTEM_WRITES) with its size and mtime."""
    prune = " -o ".join(f"-path {path}" for path in SYSTEM_WRITES)
    text = ssh(address, f"find / -xdev \\( {prune} \\) -prune -o -printf '%p\\t%s %T@\\n'")
    found = dict(line.split("\t", 1) for line in text.splitlines())
    assert len(found) > 1000, f"the listing of {address} looks truncated: {len(found)} paths"
    found = {path: info for path, info in found.items() if not path.startswith(f"{HOME}/.ansible")}
    found[HOME] = found[HOME].split()[0]  # its size only
    return found


def control_listing() -> dict[str, str]:
    found = {}
    for top in CONTROL:
        for path in [top, *top.rglob("*")] if top.exists() else []:
            info = path.lstat()
            found[str(path)] = f"{info.st_size} {info.st_mtime_ns}"
    return found


def changed_tasks(run: Run, host: str) -> set[str]:
    """The names of the tasks that reported ``changed`` for ``host`` in the run."""
    names, task = set(), ""
    for line in run.output.splitlines():
        if line.startswith("TASK ["):
            task = re.sub(r"^TASK \[(?:[^\]:]+ : )?(.*)\] \**$", r"\1", line)
        elif line.startswith(f"changed: [{host}"):
            names.add(task)
    return names


def moved(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """What differs between two listings, one line per path."""
    return sorted(
        f"{path}: {before.get(path, 'absent')} -> {after.get(path, 'absent')}"
        for path in before.keys() | after.keys()
        if before.get(path) != after.get(path)
    )


@pytest.fixture(scope="module")
def fresh_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Two machines fresh from the cached image (any left from an earlier run are removed first)."""
    if os.geteuid() != 0 or not (shutil.which("systemd-nspawn") and shutil.which("debootstrap")):
        pytest.skip("the testbed needs root, systemd-nspawn and debootstrap")
    runs = tmp_path_factory.mktemp("fresh-check")
    try:
        play(runs / "teardown-before", "playbooks/teardown.yml", inventory=INVENTORY).must_succeed()
        play(runs / "testbed", "playbooks/testbed.yml", inventory=INVENTORY).must_succeed()
        yield runs
    finally:
        if os.environ.get("SPARKFOLD_TESTBED_KEEP") != "1":
            play(runs / "teardown", "playbooks/teardown.yml", inventory=INVENTORY).must_succeed()


@pytest.fixture(scope="module")
def check_run(fresh_pair: Path) -> Checked:
    """The check run, with listings of the nodes and the control host taken before and after it."""

    def listings() -> Listings:
        nodes = {name: node_listing(address) for name, address in NODES.items()}
        return nodes | {"control": control_listing()}

    before = listings()
    run = play(fresh_pair / "check", "site.yml", check=True, diff=True, inventory=INVENTORY)
    return run, before, listings()


def test_check_run_on_a_fresh_pair_passes(check_run: Checked) -> None:
    run, _, _ = check_run
    run.must_succeed()
    assert set(run.stats.get("ok", {})) == set(NODES)
    assert not run.stats.get("failures") and not run.stats.get("dark"), run.stats


def test_check_run_says_what_a_first_run_would_install_and_start(check_run: Checked) -> None:
    run, _, _ = check_run
    said = " ".join(run.output.split())  # the log wraps long messages
    for node in NODES:
        apt = re.search(rf"{node}: would install with apt: ([^(]+)", said)
        assert apt, f"no apt report for {node}"
        packages = set(re.split(r"[,\s]+", apt[1].strip()))
        assert {"python3-venv", "rsync", "iproute2", "python3-apt"} <= packages, packages
        assert f"{node}: would run `sparkfold preflight`" in said
        assert f"{node}: would copy the dependency wheels" in said
        assert {
            "Render the settings, checked by `sparkfold config check` first, /etc/sparkfold/sparkfold.toml",
            "Install sparkfold-engine.service",
            "Report the units a real run would install, enable and start",
        } <= changed_tasks(run, node)
    assert re.search(
        r"sfck-head: would copy 1 file \(\d+ bytes\) .* to /var/lib/sparkfold/models/smollm2 ", said
    )
    assert "would enable and start sparkfold-engine.service and sparkfold-api.service" in said
    assert "Install sparkfold-api.service (head)" in changed_tasks(run, "sfck-head")
    # --diff shows the settings each node would get.
    assert run.output.count('+kind = "transformers"') == 2
    assert '+name = "sfck-worker"' in run.output


def test_check_run_writes_nothing_on_the_nodes(check_run: Checked) -> None:
    _, before, after = check_run
    for node in NODES:
        differs = moved(before[node], after[node])
        assert not differs, f"{node}: " + "\n".join(differs[:40])


def test_check_run_writes_nothing_on_the_control_host(check_run: Checked) -> None:
    _, before, after = check_run
    differs = moved(before["control"], after["control"])
    assert not differs, "\n".join(differs[:40])
