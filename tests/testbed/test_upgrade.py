"""The upgrade drill: the previous release serves, today's checkout converges over it, and back.

Unless ``SPARKFOLD_UPGRADE_DRILL=0`` (then its tests skip, saying so; the nodes' version is checked
either way), the session's first converge of today's checkout is the upgrade (conftest.py's ``upgrade``): the
pair ran the previous release, converged from that release's own tree and testbed inventory, and
served a stream while today's site.yml ran. ``test_pair.py``'s second converge proves the upgraded
pair re-runs with ``changed=0``. The last test goes back to the previous release; this module's
name sorts last, so no test runs on the older pair after it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from testbed_kit import (
    HEAD,
    REPO,
    WORKER,
    Run,
    chat_answers,
    installed_version,
    play,
    restarts_issued,
    starts_since,
    unit,
    wait_for,
)
from upgrade_drill import Previous, Upgrade

pytestmark = [pytest.mark.testbed, pytest.mark.slow, pytest.mark.netns, pytest.mark.timeout(1800)]
RESTARTS = {
    "Engine | restart on the worker": "sftb-worker",
    "Engine | restart on the head": "sftb-head",
    "API | restart": "sftb-head",
}


def checkout_version() -> str:
    """This checkout's version, as the wheel the runtime stage builds from it carries (setuptools-scm)."""
    done = subprocess.run(
        [sys.executable, "-m", "setuptools_scm"], cwd=REPO, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def commit_of(tree: Path, ref: str) -> str:
    return subprocess.run(
        ["git", "-C", str(tree), "rev-parse", ref], capture_output=True, text=True, check=True
    ).stdout.strip()


@pytest.fixture
def upgraded(upgrade: Upgrade) -> Upgrade:
    if upgrade.skipped:
        pytest.skip(f"no upgrade drill: {upgrade.skipped}")
    upgrade.run.must_succeed()
    return upgrade


def test_the_previous_release_served_from_its_own_tree(upgraded: Upgrade) -> None:
    previous = upgraded.previous
    assert previous is not None
    release = previous.release
    for node in (HEAD, WORKER):
        assert previous.versions[node] == f"sparkfold {release.version} (commit {release.commit[:9]})"


def test_the_upgrade_restarts_each_unit_once_worker_first(upgraded: Upgrade) -> None:
    run = upgraded.run
    for task, host in RESTARTS.items():
        assert restarts_issued(run, task, host) == 1, f"{task}: {run.output[-4000:]}"
    assert upgraded.starts == {"head engine": 1, "api": 1}
    worker, head = upgraded.units["worker engine"], upgraded.units["head engine"]
    # One kernel, one monotonic clock: the two machines' start times compare directly.
    assert int(worker["ExecMainStartTimestampMonotonic"]) < int(head["ExecMainStartTimestampMonotonic"])


def test_a_stream_in_flight_at_the_restart_ends_with_an_error_and_done(upgraded: Upgrade) -> None:
    streams = upgraded.streams
    assert not upgraded.streams_hung, "a stream through the restart never ended"
    assert streams, "no stream ran: the service stage's play never started"
    *before, last = streams
    # In flight at the restart: taken by the engine, whether or not its first chunk had come (the
    # CPU engine may still be prefilling it when the worker's restart breaks the pair).
    assert last.accepted, f"the restart came between two streams ({len(streams)}): {last.lines[-3:]}"
    assert last.cut and last.done, last.lines[-3:]
    for stream in before:  # those that ended before the restart ended as streams do
        assert stream.opened and stream.done and not stream.cut, stream.lines[-3:]


def test_requests_after_the_upgrade_succeed(upgraded: Upgrade, api_key: str) -> None:
    wait_for("the upgraded pair to answer", lambda: chat_answers(api_key), timeout_s=600, every_s=5)


def test_the_nodes_run_this_checkouts_version(first_converge: Run) -> None:
    first_converge.must_succeed()
    version = checkout_version()
    for node in (HEAD, WORKER):
        name, found, commit = installed_version(node).split(" ", 2)
        assert (name, found) == ("sparkfold", version)
        assert commit_of(REPO, "HEAD").startswith(commit.removeprefix("(commit ").rstrip(")"))


def test_the_way_back_converges_the_previous_release_from_its_tree(
    previous: Previous | str, first_converge: Run, artifacts: Path, api_key: str
) -> None:
    """The previous release's site.yml over today's pair, in the shape the session left it in
    (test_tensorfold_standin.py's: the production engine kind), as a user goes back: from the
    release's checkout, with the same inventory."""
    if isinstance(previous, str):
        pytest.skip(f"no release to go back to: {previous}")
    first_converge.must_succeed()
    release, tree = previous.release, previous.tree
    shape = yaml.safe_load((tree / "inventory/testbed-tensorfold.yml").read_text())
    back = play(artifacts / "way-back", "site.yml", root=tree, env=release.env, extravars=shape)
    back.must_succeed()
    for task, host in RESTARTS.items():
        assert restarts_issued(back, task, host) == 1, f"{task}: {back.output[-4000:]}"
    assert starts_since(HEAD, "sparkfold-engine", back.started_at) == 1
    head, worker = unit(HEAD, "sparkfold-engine"), unit(WORKER, "sparkfold-engine")
    assert int(worker["ExecMainStartTimestampMonotonic"]) < int(head["ExecMainStartTimestampMonotonic"])
    for node in (HEAD, WORKER):
        assert installed_version(node) == f"sparkfold {release.version} (commit {release.commit[:9]})"
    wait_for("the previous release to answer again", lambda: chat_answers(api_key), timeout_s=600, every_s=5)
