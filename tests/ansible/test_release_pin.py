"""``sparkfold_release`` pins the release a pair runs: a checkout of another version stops on the
control host before any node is touched, naming the commands that converge the pinned release
(roles/sparkfold_preflight/tasks/release.yml; docs/releasing.md, "Going back")."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from local_head import ansible, write_inventory


def checkout_version(repo: Path) -> str:
    """This checkout's version as its wheel would carry it (setuptools-scm, from git)."""
    done = subprocess.run(
        [sys.executable, "-m", "setuptools_scm"], cwd=repo, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def test_another_release_pinned_stops_the_pair_before_any_node_is_touched(repo: Path) -> None:
    # inventory/example's nodes do not exist: any task that reached one would fail unreachable.
    result = ansible(
        repo, "ansible-playbook", "-i", "inventory/example", "site.yml", "-e", "sparkfold_release=v0.0.1"
    )
    assert result.returncode != 0
    said = " ".join(result.stdout.split())
    assert "unreachable=0" in said and "UNREACHABLE" not in said, result.stdout[-3000:]
    version = checkout_version(repo)
    tree = repo.parent / "sparkfold-v0.0.1"
    assert f"the inventory pins sparkfold_release 0.0.1, and this checkout ({repo}) is {version}" in said
    assert f"`git -C {repo} worktree add {tree} v0.0.1` (or `git checkout v0.0.1` here)" in said
    assert f"then `cd {tree}` and run it again with -i {repo / 'inventory/example'}" in said
    # Nothing past the check ran: the first stage's package install is the first task to reach a node.
    assert "Install the node's prerequisites" not in result.stdout


def test_the_checkouts_own_release_pinned_passes(repo: Path, tmp_path: Path) -> None:
    hosts = write_inventory(tmp_path, sparkfold_release=f"v{checkout_version(repo)}")
    role = ["-e", "role=sparkfold_preflight", "-e", "tasks_file=release.yml"]
    result = ansible(repo, "ansible-playbook", "-i", str(hosts), "tests/ansible/role_tasks.yml", *role)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Stop unless this checkout is the release the inventory pins" in result.stdout
