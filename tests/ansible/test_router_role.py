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


def test_each_pair_head_lets_only_the_router_host_reach_its_gateway_unless_the_inventory_opens_it(
    repo: Path, tmp_path: Path
) -> None:
    render(repo, repo / "inventory/fleet-example", tmp_path / "closed")
    for head in ("spark-a-head", "spark-b-head"):
        rules = (tmp_path / "closed" / head / "gateway-filter.nft").read_text()
        assert "elements = { 198.51.100.21 }" in rules  # the router host (spark-a-head) only
        assert 'tcp dport 8888 iif "lo" accept' in rules and "tcp dport 8888 counter drop" in rules
        assert rules.index("@allowed4 accept") < rules.index("counter drop")
    assert not (tmp_path / "closed" / "spark-a-worker").exists()  # workers run no gateway
    inventory = tmp_path / "inventory"
    shutil.copytree(repo / "inventory/fleet-example", inventory)
    hosts = yaml.safe_load((inventory / "hosts.yml").read_text())
    hosts["sparkfold_nodes"]["children"]["pair_b"]["vars"]["sparkfold_pair_gateway_allow"] = [
        "198.51.100.64/26"
    ]
    (inventory / "hosts.yml").write_text(yaml.safe_dump(hosts))
    render(repo, inventory, tmp_path / "open")
    assert (
        "elements = { 198.51.100.21, 198.51.100.64/26 }"
        in (tmp_path / "open/spark-b-head/gateway-filter.nft").read_text()
    )
    assert "elements = { 198.51.100.21 }" in (tmp_path / "open/spark-a-head/gateway-filter.nft").read_text()


def test_the_fleet_testbed_keeps_to_its_own_names_and_address_block(repo: Path) -> None:
    """sffl-* names, 198.51.100.128/26 on its own bridge, no 203.0.113.x outside a namespace:
    it can run beside the pair testbed (sftb-*, 198.51.100.1/24)."""
    import ipaddress

    block = ipaddress.ip_network("198.51.100.128/26")
    inventory = repo / "inventory/fleet-testbed"
    hosts = yaml.safe_load((inventory / "hosts.yml").read_text())
    testbed = yaml.safe_load((inventory / "group_vars/all/testbed.yml").read_text())
    nodes = {}
    for pair in hosts["sparkfold_nodes"]["children"].values():
        for group in pair["children"].values():
            nodes |= group.get("hosts") or {}
    assert sorted(nodes) == ["sffl-a", "sffl-b"] and list(hosts["sparkfold_router"]["hosts"]) == ["sffl-a"]
    assert all(n["sparkfold_testbed_netns"].startswith("sffl-") for n in nodes.values())
    assert all(ipaddress.ip_address(n["ansible_host"]) in block for n in nodes.values())
    assert all("sparkfold_fabric_address" not in n for n in nodes.values())  # one-node pairs
    assert testbed["sparkfold_testbed_bridge"] == "sffl-br0"
    bridge = ipaddress.ip_interface(testbed["sparkfold_testbed_bridge_address"])
    assert bridge.network == block and bridge.ip not in {
        ipaddress.ip_address(n["ansible_host"]) for n in nodes.values()
    }
    assert (
        testbed["sparkfold_testbed_fabric_links"] == []
        and "nftables" in testbed["sparkfold_testbed_served_packages"]
    )
