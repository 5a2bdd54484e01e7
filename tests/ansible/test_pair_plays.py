"""Pair plays fail together: one node failing stops the other (``any_errors_fatal``), shown with a
two-node inventory on this host (both nodes over a local connection) whose worker fails preflight."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import yaml
from local_head import ansible

PAIR_STAGES = ["preflight", "fabric", "image", "weights", "runtime", "service"]


@pytest.mark.parametrize("stage", PAIR_STAGES)
def test_every_pair_stage_fails_together(repo: Path, stage: str) -> None:
    [play] = yaml.safe_load((repo / f"playbooks/stages/{stage}.yml").read_text())
    assert play.get("any_errors_fatal") is True, f"playbooks/stages/{stage}.yml goes on with half a pair"


def pair_inventory(folder: Path, worker_address: str) -> Path:
    node = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inventory = {
        "sparkfold_nodes": {
            "children": {
                "sparkfold_head": {"hosts": {"h1": {**node, "sparkfold_fabric_address": "203.0.113.1"}}},
                "sparkfold_worker": {"hosts": {"h2": {**node, "sparkfold_fabric_address": worker_address}}},
            },
            "vars": {
                "sparkfold_engine": "transformers",
                "sparkfold_engine_tp": 2,
                "sparkfold_control_dir": str(folder / "control"),
                "sparkfold_install_dir": str(folder / "install"),
            },
        }
    }
    hosts = folder / "hosts.yml"
    hosts.write_text(yaml.safe_dump(inventory))
    return hosts


def test_a_worker_failing_preflight_stops_the_head_too(repo: Path, tmp_path: Path) -> None:
    hosts = pair_inventory(tmp_path, worker_address="not-an-address")
    # The package counts as installed: the run must stop before any node is asked anything.
    result = ansible(
        repo,
        "ansible-playbook",
        "-i",
        str(hosts),
        "playbooks/preflight.yml",
        "-e",
        "__sparkfold_runtime_installed=true",
    )
    out = result.stdout + result.stderr
    assert result.returncode != 0, out
    assert re.search(r"fatal: \[h2\]", out) and "sparkfold_fabric_address is 'not-an-address'" in out, out
    # The head never went on to the node checks, and nothing was written on it.
    assert "Render candidate settings" not in out, out
    assert not (tmp_path / "install").exists()
