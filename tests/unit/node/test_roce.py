"""RoCE discovery on fake sysfs trees shaped like a DGX Spark's CX7 port (two PCIe twins)."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest
from node_fakes import FakeHost, add_roce_port, settings

from sparkfold.engines.tensorfold.launch import FabricFacts, LaunchError
from sparkfold.node.checks import Check
from sparkfold.node.fabric import discover, ipv4_mapped_gid
from sparkfold.node.roce import fabric_facts, twin_netdev
from sparkfold.node.tensorfold_rank import fabric_facts_for

LINK = {"fabric": {"address": "203.0.113.1", "peer": "203.0.113.2", "mtu": 9000}}
NETDEV, TWIN = "enp1s0f1np1", "enP2p1s0f1np1"
HCA, TWIN_HCA = "rocep1s0f1", "roceP2p1s0f1"
LINK_LOCAL = ("fe80:0000:0000:0000:0000:0000:0000:0001", "IB/RoCE v1")


def gid(address: str) -> str:
    return ipv4_mapped_gid(ipaddress.IPv4Address(address))


def spark(
    sysfs: Path,
    host: FakeHost,
    *,
    twin_address: str | None = "198.51.100.11",
    twin_gid_index: int = 3,
    link_state: str = "4: ACTIVE",
    twin_ping_rc: int = 0,
    primary_gid: bool = True,
) -> None:
    """A Spark's port 1: the link netdev and its twin, each with the usual GID table."""
    primary = {0: LINK_LOCAL, 1: LINK_LOCAL}
    if primary_gid:
        primary.update({2: (gid("203.0.113.1"), "IB/RoCE v1"), 3: (gid("203.0.113.1"), "RoCE v2")})
    add_roce_port(sysfs, NETDEV, HCA, primary)
    twin = {0: LINK_LOCAL, 1: LINK_LOCAL}
    if twin_address:
        twin.update(
            {
                twin_gid_index - 1: (gid(twin_address), "IB/RoCE v1"),
                twin_gid_index: (gid(twin_address), "RoCE v2"),
            }
        )
    add_roce_port(sysfs, TWIN, TWIN_HCA, twin)
    for dev, hca in ((NETDEV, HCA), (TWIN, TWIN_HCA)):
        (sysfs / "class/net" / dev / "operstate").write_text("up\n" if "ACTIVE" in link_state else "down\n")
        (sysfs / "class/infiniband" / hca / "ports/1/state").write_text(link_state + "\n")
    (sysfs / "class/net/wlP9s9").mkdir(parents=True)  # an unrelated netdev
    host.answer(
        ["ip", "-j", "-4", "route", "get"],
        0,
        [{"dst": "203.0.113.2", "dev": NETDEV, "prefsrc": "203.0.113.1"}],
    )
    host.answer(["ip", "-j", "link", "show"], 0, [{"ifname": NETDEV, "mtu": 9000}])
    addr_info = [{"family": "inet", "local": twin_address, "prefixlen": 24}] if twin_address else []
    host.answer(
        ["ip", "-j", "-4", "addr", "show", "dev", TWIN], 0, [{"ifname": TWIN, "addr_info": addr_info}]
    )
    host.answer(["ping", "-c", "2", "-W", "2", "-I", NETDEV], 0)
    host.answer(["ping", "-c", "2", "-W", "2", "-I", TWIN], twin_ping_rc)


def check(report_checks: list[Check], name: str) -> Check:
    return next(c for c in report_checks if c.name == name)


def test_twin_is_found_by_its_pcie_tail(tmp_path: Path, host: FakeHost) -> None:
    spark(tmp_path, host)
    assert twin_netdev(NETDEV, tmp_path) == TWIN
    assert twin_netdev(TWIN, tmp_path) == NETDEV
    assert twin_netdev("eth0", tmp_path) is None


def test_two_twins_addressed_give_two_rails(tmp_path: Path, host: FakeHost) -> None:
    spark(tmp_path, host)
    report = discover(settings(**LINK), sysfs=tmp_path, run=host)
    assert report.ok, report.to_dict()
    assert report.facts["rdma_devices"] == [HCA, TWIN_HCA]
    assert report.facts["nccl"] == {
        "NCCL_SOCKET_IFNAME": NETDEV,
        "NCCL_IB_HCA": "rocep1s0f1,roceP2p1s0f1",
        "NCCL_IB_GID_INDEX": "3",
    }
    twin_ping = next(c for c in host.calls if c[0] == "ping" and TWIN in c)
    assert twin_ping[-1] == "198.51.100.12" and twin_ping[twin_ping.index("-s") + 1] == "8972"
    assert fabric_facts(report) == FabricFacts(NETDEV, (HCA, TWIN_HCA), 3)
    assert fabric_facts(report.to_dict()["facts"]) == FabricFacts(NETDEV, (HCA, TWIN_HCA), 3)


def test_twin_in_the_link_subnet_pings_the_peer(tmp_path: Path, host: FakeHost) -> None:
    spark(tmp_path, host, twin_address="203.0.113.3")
    report = discover(settings(**LINK), sysfs=tmp_path, run=host)
    assert report.facts["rdma_devices"] == [HCA, TWIN_HCA]
    assert next(c for c in host.calls if c[0] == "ping" and TWIN in c)[-1] == "203.0.113.2"


def test_one_twin_addressed_gives_one_rail(tmp_path: Path, host: FakeHost) -> None:
    spark(tmp_path, host, twin_address=None)
    report = discover(settings(**LINK), sysfs=tmp_path, run=host)
    assert report.ok, report.to_dict()
    assert report.facts["nccl"]["NCCL_IB_HCA"] == HCA
    assert "has no IPv4 address" in check(report.checks, "rails").detail
    assert fabric_facts(report) == FabricFacts(NETDEV, (HCA,), 3)


def test_twin_failing_the_full_size_ping_is_dropped_with_a_warning(tmp_path: Path, host: FakeHost) -> None:
    spark(tmp_path, host, twin_ping_rc=1)
    report = discover(settings(**LINK), sysfs=tmp_path, run=host)
    assert report.ok
    assert report.facts["rdma_devices"] == [HCA]
    assert "NOT used, running on fewer rails" in check(report.checks, "rails").detail


def test_no_ping_keeps_an_addressed_twin_unproven(tmp_path: Path, host: FakeHost) -> None:
    spark(tmp_path, host)
    report = discover(settings(**LINK), sysfs=tmp_path, run=host, ping=False)
    assert report.facts["rdma_devices"] == [HCA, TWIN_HCA]
    assert not any(c[0] == "ping" for c in host.calls)


def test_no_gid_is_the_recipe_error(tmp_path: Path, host: FakeHost) -> None:
    spark(tmp_path, host, primary_gid=False)
    report = discover(settings(**LINK), sysfs=tmp_path, run=host)
    [failure] = report.failures
    assert failure.name == "rdma"
    assert failure.detail.startswith("no RoCE device or RoCE v2 GID for the link")
    assert "nccl" not in report.facts and fabric_facts(report) is None


def test_twin_gid_on_the_wrong_index_is_left_out(tmp_path: Path, host: FakeHost) -> None:
    spark(tmp_path, host, twin_gid_index=5)
    report = discover(settings(**LINK), sysfs=tmp_path, run=host)
    assert report.ok
    assert report.facts["nccl"]["NCCL_IB_HCA"] == HCA
    assert "no RoCE v2 GID for 198.51.100.11 at index 3" in check(report.checks, "rails").detail


def test_configured_gid_index_other_than_the_found_one_fails(tmp_path: Path, host: FakeHost) -> None:
    spark(tmp_path, host)
    link = {"fabric": {**LINK["fabric"], "gid_index": 1}}
    [failure] = discover(settings(**link), sysfs=tmp_path, run=host).failures
    assert "fabric.gid_index is 1" in failure.detail and "is 3" in failure.detail


def test_link_down_fails_with_the_cable_hint(tmp_path: Path, host: FakeHost) -> None:
    spark(tmp_path, host, link_state="1: DOWN")
    report = discover(settings(**LINK), sysfs=tmp_path, run=host, ping=False)
    [failure] = report.failures
    assert failure.name == "link" and "the link is down" in failure.detail and "DOWN" in failure.detail
    assert "QSFP cable" in failure.fix
    assert "nccl" not in report.facts


def test_configured_rails_narrow_the_discovered_ones(tmp_path: Path, host: FakeHost) -> None:
    spark(tmp_path, host)
    link = {"fabric": {**LINK["fabric"], "rdma_devices": [HCA]}}
    report = discover(settings(**link), sysfs=tmp_path, run=host)
    assert report.ok and report.facts["nccl"]["NCCL_IB_HCA"] == HCA


def test_the_rank_uses_written_facts_and_discovers_the_rest(tmp_path: Path, host: FakeHost) -> None:
    spark(tmp_path, host)
    pair = {"engine": {"model": "/m", "kind": "tensorfold", "tp": 2}}
    written = {"fabric": {**LINK["fabric"], "socket_ifname": "x0", "rdma_devices": ["r0"], "gid_index": 1}}
    assert fabric_facts_for(settings(**pair, **written), sysfs=tmp_path, run=host) == FabricFacts(
        "x0", ("r0",), 1
    )
    assert host.calls == []
    found = fabric_facts_for(settings(**pair, **LINK), sysfs=tmp_path, run=host)
    assert found == FabricFacts(NETDEV, (HCA, TWIN_HCA), 3)
    assert not any(call[0] == "ping" for call in host.calls), "a start trusts the fabric stage's ping"


def test_the_rank_refuses_to_start_without_a_roce_link(tmp_path: Path, host: FakeHost) -> None:
    spark(tmp_path, host, primary_gid=False)
    pair = {"engine": {"model": "/m", "kind": "tensorfold", "tp": 2}}
    with pytest.raises(
        LaunchError, match="fabric discovery found no RoCE link for NCCL: FAIL rdma: no RoCE device"
    ):
        fabric_facts_for(settings(**pair, **LINK), sysfs=tmp_path, run=host)
