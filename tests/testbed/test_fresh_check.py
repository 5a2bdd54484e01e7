"""``site.yml --check --diff`` on a fresh pair: it passes, says what a first run would do, writes nothing.

The shared pair before its first converge (``conftest.fresh_check``, which ``first_converge``
depends on): two machines fresh from the cached node image, so the check run meets what a first run
meets (no python3-apt, rsync, iproute2, venv, settings or units). The converged pair's check run is
``test_pair.py``'s.

What counts as written: every path, size and mtime of each node's filesystem outside the folders a
running system writes by itself, and the control host's ``.cache/control`` plus the build folders
setuptools would leave in the checkout (``listing.py``).
"""

from __future__ import annotations

import re

import pytest
from listing import Checked, moved
from testbed_kit import NODES, Run

pytestmark = [pytest.mark.testbed, pytest.mark.slow, pytest.mark.netns, pytest.mark.timeout(1800)]


@pytest.fixture
def checked(fresh_check: Checked) -> Checked:
    if fresh_check.stale:
        pytest.skip(f"no fresh pair to check: {fresh_check.stale} (SPARKFOLD_TESTBED_KEEP)")
    return fresh_check


def check_run(checked: Checked) -> Run:
    assert checked.run is not None
    return checked.run


def changed_tasks(run: Run, host: str) -> set[str]:
    """The names of the tasks that reported ``changed`` for ``host`` in the run."""
    names, task = set(), ""
    for line in run.output.splitlines():
        if line.startswith("TASK ["):
            task = re.sub(r"^TASK \[(?:[^\]:]+ : )?(.*)\] \**$", r"\1", line)
        elif line.startswith(f"changed: [{host}"):
            names.add(task)
    return names


def test_check_run_on_a_fresh_pair_passes(checked: Checked) -> None:
    run = check_run(checked)
    run.must_succeed()
    assert set(run.stats.get("ok", {})) == NODES
    assert not run.stats.get("failures") and not run.stats.get("dark"), run.stats


def test_check_run_says_what_a_first_run_would_install_and_start(checked: Checked) -> None:
    run = check_run(checked)
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
        r"sftb-head: would copy 1 file \(\d+ bytes\) .* to /var/lib/sparkfold/models/smollm2 ", said
    )
    assert "would enable and start sparkfold-engine.service and sparkfold-api.service" in said
    assert "Install sparkfold-api.service (head)" in changed_tasks(run, "sftb-head")
    # --diff shows the settings each node would get.
    assert run.output.count('+kind = "transformers"') == 2
    assert '+name = "sftb-worker"' in run.output


def test_check_run_writes_nothing_on_the_nodes(checked: Checked) -> None:
    for node in NODES:
        differs = moved(checked.before[node], checked.after[node])
        assert not differs, f"{node}: " + "\n".join(differs[:40])


def test_check_run_writes_nothing_on_the_control_host(checked: Checked) -> None:
    differs = moved(checked.before["control"], checked.after["control"])
    assert not differs, "\n".join(differs[:40])
