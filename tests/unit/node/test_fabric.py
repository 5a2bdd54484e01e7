"""``sparkfold.node.fabric`` against scripted ``ip``/``ping`` answers and a fake sysfs tree."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest
from node_fakes import FakeHost, add_roce_port, settings

from sparkfold.node.fabric import discover, discover_settled, ipv4_mapped_gid

LINK = {"fabric": {"address": "203.0.113.1", "peer": "203.0.113.2", "mtu": 9000}}
GID = "0000:0000:0000:0000:0000:ffff:cb00:7101"  # ::ffff:203.0.113.1


def healthy(host: FakeHost, dev: str = "enp1s0f0np0", mtu: int = 9000) -> None:
    host.answer(
        ["ip", "-j", "-4", "route", "get"], 0, [{"dst": "203.0.113.2", "dev": dev, "prefsrc": "203.0.113.1"}]
    )
    host.answer(["ip", "-j", "link", "show"], 0, [{"ifname": dev, "mtu": mtu}])
    host.answer(["ping"], 0)


def test_ipv4_mapped_gid_is_the_sysfs_spelling() -> None:
    assert ipv4_mapped_gid(ipaddress.IPv4Address("203.0.113.1")) == GID


def test_link_without_rdma_passes_and_pings_full_size(tmp_path: Path, host: FakeHost) -> None:
    healthy(host)
    report = discover(settings(**LINK), sysfs=tmp_path, run=host)
    assert report.ok, report.to_dict()
    assert report.facts == {
        "netdev": "enp1s0f0np0",
        "address": "203.0.113.1",
        "peer": "203.0.113.2",
        "mtu": 9000,
    }
    ping = next(call for call in host.calls if call[0] == "ping")
    assert ping[ping.index("-M") + 1] == "do" and ping[ping.index("-s") + 1] == "8972"
    assert next(c for c in report.checks if c.name == "rdma").skipped


def test_roce_v2_gid_index_is_found(tmp_path: Path, host: FakeHost) -> None:
    healthy(host)
    add_roce_port(
        tmp_path,
        "enp1s0f0np0",
        "rocep1s0f0",
        {
            0: ("fe80:0000:0000:0000:0000:0000:0000:0001", "IB/RoCE v1"),
            2: (GID, "IB/RoCE v1"),
            3: (GID, "RoCE v2"),
        },
    )
    report = discover(settings(**LINK), sysfs=tmp_path, run=host)
    assert report.ok, report.to_dict()
    assert report.facts["rdma_devices"] == ["rocep1s0f0"] and report.facts["gid_index"] == 3


def test_only_a_v1_gid_is_a_clear_error(tmp_path: Path, host: FakeHost) -> None:
    healthy(host)
    add_roce_port(tmp_path, "enp1s0f0np0", "rocep1s0f0", {2: (GID, "IB/RoCE v1")})
    report = discover(settings(**LINK), sysfs=tmp_path, run=host)
    [failure] = report.failures
    assert failure.name == "rdma" and "no RoCE device or RoCE v2 GID for the link" in failure.detail
    assert "fabric.peer" in failure.fix


def test_netdev_without_rdma_device_on_an_rdma_host(tmp_path: Path, host: FakeHost) -> None:
    healthy(host, dev="eth0")
    add_roce_port(tmp_path, "enp1s0f0np0", "rocep1s0f0", {3: (GID, "RoCE v2")})
    [failure] = discover(settings(**LINK), sysfs=tmp_path, run=host).failures
    assert "eth0 has no RDMA device" in failure.detail and "is eth0 the CX7 port" in failure.fix


def test_configured_gid_index_must_match(tmp_path: Path, host: FakeHost) -> None:
    healthy(host)
    add_roce_port(tmp_path, "enp1s0f0np0", "rocep1s0f0", {3: (GID, "RoCE v2")})
    link = {"fabric": {**LINK["fabric"], "gid_index": 1}}
    [failure] = discover(settings(**link), sysfs=tmp_path, run=host).failures
    assert "fabric.gid_index is 1" in failure.detail and "on rocep1s0f0 is 3" in failure.detail


def test_no_route(tmp_path: Path, host: FakeHost) -> None:
    host.answer(["ip", "-j", "-4", "route", "get"], 2, "")
    [failure] = discover(settings(**LINK), sysfs=tmp_path, run=host).failures
    assert failure.detail == "no route from this node to 203.0.113.2" and "ip -4 addr" in failure.fix


def test_route_through_a_gateway_is_not_a_link(tmp_path: Path, host: FakeHost) -> None:
    host.answer(
        ["ip", "-j", "-4", "route", "get"],
        0,
        [{"dst": "203.0.113.2", "gateway": "198.51.100.1", "dev": "eth0", "prefsrc": "198.51.100.5"}],
    )
    [failure] = discover(settings(**LINK), sysfs=tmp_path, run=host).failures
    assert "through the gateway 198.51.100.1 on eth0" in failure.detail


def test_route_from_another_source_address(tmp_path: Path, host: FakeHost) -> None:
    host.answer(["ip", "-j", "-4", "route", "get"], 0, [{"dev": "eth1", "prefsrc": "203.0.113.9"}])
    [failure] = discover(settings(**LINK), sysfs=tmp_path, run=host).failures
    assert "from 203.0.113.9, not from fabric.address 203.0.113.1" in failure.detail


def test_mtu_mismatch_stops_before_the_ping(tmp_path: Path, host: FakeHost) -> None:
    healthy(host, mtu=1500)
    report = discover(settings(**LINK), sysfs=tmp_path, run=host)
    [failure] = report.failures
    assert failure.detail == "enp1s0f0np0 has MTU 1500, fabric.mtu is 9000" and "BOTH nodes" in failure.fix
    assert not any(call[0] == "ping" for call in host.calls)


def test_failed_ping_names_both_ends(tmp_path: Path, host: FakeHost) -> None:
    healthy(host)
    host.answer(["ping"], 1)
    [failure] = discover(settings(**LINK), sysfs=tmp_path, run=host).failures
    assert failure.detail == "a 9000-byte unfragmentable ping from enp1s0f0np0 to 203.0.113.2 failed"


def test_no_ping_option_skips_it(tmp_path: Path, host: FakeHost) -> None:
    healthy(host)
    host.answer(["ping"], 1)
    report = discover(settings(**LINK), sysfs=tmp_path, run=host, ping=False)
    assert report.ok and not any(call[0] == "ping" for call in host.calls)


def test_peer_unset(tmp_path: Path, host: FakeHost) -> None:
    [failure] = discover(settings(), sysfs=tmp_path, run=host).failures
    assert failure.detail == "fabric.peer is not set"


# --- After an asynchronous `netplan apply`: look again, bounded ------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_link_that_comes_up_while_waiting_passes(tmp_path: Path, host: FakeHost) -> None:
    host.answer(["ip", "-j", "-4", "route", "get"], 2, "")  # networkd has not applied the address yet
    clock, naps = Clock(), []

    def sleep(seconds: float) -> None:
        naps.append(seconds)
        clock.now += seconds
        if len(naps) == 3:  # the address lands during the third wait
            healthy(host)

    report = discover_settled(settings(**LINK), 30, sysfs=tmp_path, run=host, sleep=sleep, clock=clock)
    assert report.ok, report.to_dict()
    assert report.facts["attempts"] == 4 and naps == [2.0, 2.0, 2.0]


def test_a_link_that_never_comes_up_fails_once_the_time_is_spent(tmp_path: Path, host: FakeHost) -> None:
    host.answer(["ip", "-j", "-4", "route", "get"], 2, "")
    clock = Clock()

    def sleep(seconds: float) -> None:
        clock.now += seconds

    report = discover_settled(settings(**LINK), 9, sysfs=tmp_path, run=host, sleep=sleep, clock=clock)
    assert not report.ok and "no route from this node to 203.0.113.2" in report.failures[0].detail
    assert report.facts["attempts"] == 5 and clock.now == 8.0  # looks at 0, 2, 4, 6, 8: never past 9 s


def test_settle_zero_looks_once(tmp_path: Path, host: FakeHost) -> None:
    host.answer(["ip", "-j", "-4", "route", "get"], 2, "")
    report = discover_settled(settings(**LINK), 0, sysfs=tmp_path, run=host, sleep=pytest.fail)
    assert not report.ok and report.facts["attempts"] == 1


@pytest.mark.parametrize(("rdma", "ok"), [(True, False), (False, True)])
def test_a_node_without_verbs_devices_fails_when_the_ranks_use_rdma(
    tmp_path: Path, host: FakeHost, rdma: bool, ok: bool
) -> None:
    """No /sys/class/infiniband at all: a failure naming the netdev when the tensorfold ranks use
    RDMA (its default), skipped where they do not (engine.tensorfold.rdma = false: the testbed)."""
    healthy(host)
    engine = {"kind": "tensorfold", "tp": 2, "tensorfold": {"rdma": rdma}}
    report = discover(settings(engine=engine, **LINK), sysfs=tmp_path, run=host)
    check = next(c for c in report.checks if c.name == "rdma")
    assert (report.ok, check.ok, check.skipped) == (ok, ok, ok)
    if not ok:
        assert check.detail.startswith("enp1s0f0np0 has no verbs device")
        assert "engine.tensorfold.rdma" in check.detail and "modprobe mlx5_ib" in check.fix
