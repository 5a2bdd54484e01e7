"""The router role without a node: what the example fleet inventory renders on its router host."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from local_head import ansible
from test_ansible import exposure

from sparkfold.fleet.router import manifest, router_argv
from sparkfold.fleet.settings import load_fleet


def render(repo: Path, inventory: Path, folder: Path) -> Path:
    args = ["-i", str(inventory), "tests/ansible/render_router.yml", "-e", f"render_dir={folder}"]
    result = ansible(repo, "ansible-playbook", *args)
    assert result.returncode == 0, result.stdout + result.stderr
    return folder / "spark-a-head"


def test_the_fleet_example_renders_both_pairs_behind_the_router(repo: Path, tmp_path: Path) -> None:
    host = render(repo, repo / "inventory/fleet-example", tmp_path)
    fleet = load_fleet(host / "fleet.toml")
    assert [(p.name, p.url, p.draining) for p in fleet.pairs] == [
        ("pair-a", "http://198.51.100.21:8888", False),
        ("pair-b", "http://198.51.100.31:8888", False),
    ]
    assert fleet.front.port == 8800 and fleet.front.keys_required
    assert fleet.router.host == "127.0.0.1" and fleet.router.policy == "cache_aware"
    assert fleet.router.cache_boundaries == []  # tensorfold keeps a state at each prompt's own end
    assert "--discovery-file" in router_argv(fleet)


def test_a_drained_pair_leaves_the_manifest_and_the_exllamav3_engine_sets_its_checkpoints(
    repo: Path, tmp_path: Path
) -> None:
    inventory = tmp_path / "inventory"
    shutil.copytree(repo / "inventory/fleet-example", inventory)
    hosts = yaml.safe_load((inventory / "hosts.yml").read_text())
    hosts["sparkfold_nodes"]["children"]["pair_b"]["vars"]["sparkfold_pair_draining"] = True
    (inventory / "hosts.yml").write_text(yaml.safe_dump(hosts))
    engine = inventory / "group_vars/all/engine.yml"
    exllamav3 = {"sparkfold_engine": "exllamav3", "sparkfold_engine_context": 8192}
    settings = yaml.safe_load(engine.read_text()) | exllamav3
    engine.write_text(yaml.safe_dump(settings))
    fleet = load_fleet(render(repo, inventory, tmp_path / "out") / "fleet.toml")
    assert manifest(fleet.serving)["workers"] == [{"id": "pair-a", "url": "http://198.51.100.21:8888"}]
    assert fleet.router.cache_boundaries == [2048, 4096, 6144, 8192]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
def test_the_router_units_pass_systemd_analyze_verify_and_stay_hardened(repo: Path, tmp_path: Path) -> None:
    host = render(repo, repo / "inventory/fleet-example", tmp_path)
    for unit in ("sparkfold-router.service", "sparkfold-fleet.service"):
        check = subprocess.run(
            ["systemd-analyze", "verify", "--man=no", str(host / unit)], capture_output=True, text=True
        )
        # the venv is on the router host, not here; syntax errors are what this catches
        problems = [
            line
            for line in check.stderr.splitlines()
            if line and "is not executable" not in line and "No such file" not in line
        ]
        assert not problems, check.stderr
        assert exposure(host / unit) <= 3.0
