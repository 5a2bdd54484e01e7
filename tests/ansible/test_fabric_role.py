"""The fabric role on this host: both rails of the cabled CX7 port addressed (iproute2 through a
fake ``ip``; the netplan file as the example inventory renders it), converging to ``changed=0``."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from local_head import ansible, fake_tools, render_example, write_inventory

NETDEV, TWIN = "enp1s0f0np0", "enP2p1s0f0np0"


@pytest.fixture
def node(tmp_path: Path) -> Path:
    calls = tmp_path / "calls"
    calls.mkdir()
    down = {"mtu": 1500, "up": False, "addresses": []}
    (calls / "netdevs.json").write_text(json.dumps({NETDEV: down, TWIN: down}))
    write_inventory(
        tmp_path,
        sparkfold_fabric_netdev=NETDEV,
        sparkfold_fabric_twin_address="198.51.100.11",
        sparkfold_fabric_mtu=9000,
    )
    return tmp_path


def play(repo: Path, node: Path) -> subprocess.CompletedProcess[str]:
    args = ["-i", str(node / "hosts.yml"), "playbooks/fabric.yml", "-e", "__sparkfold_runtime_installed=true"]
    return ansible(repo, "ansible-playbook", *args, env=fake_tools(repo, node / "calls"))


def recap(result: subprocess.CompletedProcess[str]) -> dict[str, int]:
    line = next(line for line in result.stdout.splitlines() if line.startswith("h1 ") and "ok=" in line)
    return {key: int(value) for key, value in re.findall(r"(\w+)=(\d+)", line)}


@pytest.mark.skipif(
    Path("/usr/sbin/netplan").exists(), reason="this host has netplan: the role writes its file"
)
@pytest.mark.slow
def test_iproute2_addresses_both_rails_then_converges(repo: Path, node: Path) -> None:
    first = play(repo, node)
    assert first.returncode == 0, first.stdout + first.stderr
    netdevs = json.loads((node / "calls/netdevs.json").read_text())
    assert netdevs[NETDEV] == {"mtu": 9000, "up": True, "addresses": ["203.0.113.1/24"]}
    assert netdevs[TWIN] == {"mtu": 9000, "up": True, "addresses": ["198.51.100.11/24"]}
    again = play(repo, node)
    assert again.returncode == 0 and recap(again)["changed"] == 0, again.stdout
    changes = [line for line in (node / "calls/calls").read_text().splitlines() if "show" not in line]
    assert len(changes) == 6  # mtu, address, up on each rail: all in the first run


def test_the_netplan_file_names_both_rails(repo: Path, tmp_path: Path) -> None:
    render_example(repo, tmp_path, "-e", "sparkfold_fabric_twin_address=198.51.100.11")
    worker = yaml.safe_load((tmp_path / "spark-worker/netplan.yaml").read_text())["network"]["ethernets"]
    assert worker == {
        "enp1s0f0np0": {"dhcp4": False, "optional": True, "mtu": 9000, "addresses": ["203.0.113.2/24"]},
        "enP2p1s0f0np0": {"dhcp4": False, "optional": True, "mtu": 9000, "addresses": ["198.51.100.11/24"]},
    }
    head = yaml.safe_load((tmp_path / "spark-head/netplan.yaml").read_text())["network"]["ethernets"]
    assert set(head) == {"enp1s0f1np1", "enP2p1s0f1np1"}


def test_without_a_twin_address_only_the_cabled_netdev_is_written(example_render: Path) -> None:
    netplan = (example_render / "spark-worker/netplan.yaml").read_text()
    worker = yaml.safe_load(netplan)["network"]["ethernets"]
    assert list(worker) == ["enp1s0f0np0"]


def test_the_settings_do_not_freeze_the_discovered_fabric_facts(repo: Path, tmp_path: Path) -> None:
    found = json.dumps(
        {"__sparkfold_fabric_found": {"netdev": NETDEV, "rdma_devices": ["rocep1s0f0"], "gid_index": 3}}
    )
    render_example(repo, tmp_path, "-e", found)
    toml = (tmp_path / "spark-head/sparkfold.toml").read_text()
    for key in ("gid_index", "rdma_devices", "socket_ifname"):
        assert not re.search(rf"^{key} =", toml, flags=re.M), toml


# The lines of `ufw status verbose` the judge reads (Ubuntu 24.04's ufw; tests/unit/node/test_ufw.py
# has whole listings): active, denying incoming, and no rule that lets the gateway or the peer in.
UFW_DENYING = "Status: active\nDefault: deny (incoming), allow (outgoing), disabled (routed)\n"


def test_a_firewall_that_blocks_the_pair_stops_the_fabric_stage_saying_what_to_run(
    repo: Path, tmp_path: Path
) -> None:
    """Ubuntu's ufw lets ICMP in, so the link proof's ping passes; the rendezvous, NCCL and the
    gateway are TCP. The node's own judge (sparkfold doctor) decides, and a sure block stops."""
    install = tmp_path / "install/venv/bin"
    install.mkdir(parents=True)
    (install / "sparkfold").write_text(
        f"#!/bin/sh\nPYTHONPATH={repo / 'runtime'} exec {sys.executable} -c "
        "'from sparkfold.cli import main; main()' \"$@\"\n"
    )
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "ufw").write_text(f"#!/bin/sh\ncat <<'EOF'\n{UFW_DENYING}EOF\n")
    for script in (install / "sparkfold", tools / "ufw"):
        script.chmod(0o755)
    (tmp_path / "calls").mkdir()
    hosts = write_inventory(
        tmp_path,
        sparkfold_install_dir=str(tmp_path / "install"),
        sparkfold_state_dir=str(tmp_path / "state"),
        sparkfold_config_dir=str(tmp_path / "etc"),
    )
    env = fake_tools(repo, tmp_path / "calls")
    env["PATH"] = f"{tools}:{env['PATH']}"
    role = ["-e", "role=sparkfold_fabric", "-e", "tasks_file=firewall.yml"]
    result = ansible(
        repo, "ansible-playbook", "-i", str(hosts), "tests/ansible/role_tasks.yml", *role, env=env
    )
    assert result.returncode != 0, result.stdout
    said = " ".join(result.stdout.split())
    assert (
        "h1: ufw active (deny incoming) blocks the gateway port 8888/tcp: run sudo ufw allow 8888/tcp" in said
    )

    (tools / "ufw").write_text("#!/bin/sh\necho 'Status: inactive'\n")
    result = ansible(
        repo, "ansible-playbook", "-i", str(hosts), "tests/ansible/role_tasks.yml", *role, env=env
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "h1: firewall: ufw inactive" in " ".join(result.stdout.split())
