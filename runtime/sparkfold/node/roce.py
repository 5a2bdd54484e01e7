"""RoCE on a DGX Spark: the link's state, its PCIe twin as a second rail, and what NCCL is told.

One QSFP port of a Spark's ConnectX-7 reaches the GB10 over two PCIe x4 links, so one cable shows up
as two netdevs and two RDMA devices, "twins" that differ only in their PCIe domain prefix:
``enp1s0f1np1`` / ``enP2p1s0f1np1`` and ``rocep1s0f1`` / ``roceP2p1s0f1``. Each twin is one rail
of about half the port's bandwidth; NCCL stripes over both when it is given both.

:func:`add_rails` runs after :mod:`sparkfold.node.fabric` found the link's netdev, RDMA device and
RoCE v2 GID index. It adds two checks:

* ``link``: the link netdev is up and its RDMA port is ACTIVE (a cable pulled, or a peer powered off,
  shows here before NCCL times out a minute into the start);
* ``rails``: the twin, when there is one, joins as a second rail only if it is up, addressed, holds a
  RoCE v2 GID for that address at the *same* index (NCCL takes one ``NCCL_IB_GID_INDEX``) and passes
  a full-size unfragmentable ping. A twin that fails any of these is left out with the reason in the
  check's detail; running on one rail is slower, not wrong, so this check never fails.

It then writes the facts NCCL needs (``nccl``: ``NCCL_SOCKET_IFNAME``, ``NCCL_IB_HCA``,
``NCCL_IB_GID_INDEX``) and the rails (``rdma_devices``) into the report; :func:`fabric_facts` turns
such a report into the engine's :class:`~sparkfold.engines.tensorfold.FabricFacts`.
"""

from __future__ import annotations

import ipaddress
import json
import re
from pathlib import Path
from typing import Any

from sparkfold.config import Settings
from sparkfold.engines.tensorfold.launch import FabricFacts
from sparkfold.node.checks import Check, Report, Runner

__all__ = ["add_rails", "fabric_facts", "nccl_environment", "twin_netdev"]

IP_ICMP_OVERHEAD = 28  # IPv4 header (20) + ICMP header (8)
_PCIE_NAME = re.compile(r"^(?P<prefix>en(?:P\d+)?)(?P<tail>p\d+s\d+f\d+(?:np\d+)?)$")
_ACTIVE = "ACTIVE"


def twin_netdev(netdev: str, sysfs: Path) -> str | None:
    """The other netdev of the same physical port (same ``p<bus>s<slot>f<fn>np<port>`` tail)."""
    match = _PCIE_NAME.match(netdev)
    net = sysfs / "class/net"
    if match is None or not net.is_dir():
        return None
    for candidate in sorted(p.name for p in net.iterdir()):
        other = _PCIE_NAME.match(candidate)
        if other and candidate != netdev and other["tail"] == match["tail"]:
            return candidate
    return None


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8").strip()
    except OSError:
        return ""


def _rdma_device(netdev: str, sysfs: Path) -> str | None:
    hca_dir = sysfs / "class/net" / netdev / "device/infiniband"
    hcas = sorted(p.name for p in hca_dir.iterdir()) if hca_dir.is_dir() else []
    return hcas[0] if hcas else None


def _port_state(hca: str, sysfs: Path, port: int = 1) -> str:
    """``ACTIVE``, ``DOWN``, … from ``ports/<n>/state`` (``4: ACTIVE``); empty when unknown."""
    text = _read(sysfs / "class/infiniband" / hca / "ports" / str(port) / "state")
    return text.split(":", 1)[-1].strip()


def _netdev_down(netdev: str, sysfs: Path) -> bool:
    return _read(sysfs / "class/net" / netdev / "operstate") == "down"


def _ipv4_interface(netdev: str, run: Runner) -> ipaddress.IPv4Interface | None:
    result = run(["ip", "-j", "-4", "addr", "show", "dev", netdev])
    if result.returncode != 0:
        return None
    try:
        for link in json.loads(result.stdout):
            for info in link.get("addr_info", []):
                if info.get("family", "inet") == "inet":
                    return ipaddress.IPv4Interface(f"{info['local']}/{info['prefixlen']}")
    except (json.JSONDecodeError, KeyError, TypeError, ValueError):
        return None
    return None


def _gid_type_at(hca: str, index: int, sysfs: Path, port: int = 1) -> tuple[str, str]:
    base = sysfs / "class/infiniband" / hca / "ports" / str(port)
    return _read(base / "gids" / str(index)), _read(base / "gid_attrs/types" / str(index))


def _twin_target(
    twin: ipaddress.IPv4Interface, link_source: ipaddress.IPv4Address, peer: ipaddress.IPv4Address
) -> ipaddress.IPv4Address:
    """Where the twin's ping goes: the peer itself when the twin shares the link subnet, else the
    address in the twin's subnet at the peer's offset from this node (``.1``/``.2`` -> ``.11``/``.12``)."""
    if peer in twin.network:
        return peer
    return twin.ip + (int(peer) - int(link_source))


def _check_link(dev: str, hca: str, sysfs: Path, report: Report) -> bool:
    state = _port_state(hca, sysfs)
    if _netdev_down(dev, sysfs) or (state and state != _ACTIVE):
        report.add(
            Check(
                "link",
                False,
                f"the link is down: {dev} is {_read(sysfs / 'class/net' / dev / 'operstate') or 'unknown'},"
                f" RDMA port {hca}/1 is {state or 'unknown'}",
                "check the QSFP cable between the CX7 ports and that the peer is powered on"
                f" (ip link show {dev}; ibv_devinfo -d {hca})",
            )
        )
        return False
    report.add(Check("link", True, f"{dev} up, RDMA port {hca}/1 {state or 'state unknown'}"))
    return True


def _twin_rail(
    twin: str,
    gid_index: int,
    report: Report,
    peer: ipaddress.IPv4Address,
    *,
    sysfs: Path,
    run: Runner,
    ping: bool,
) -> tuple[str | None, str]:
    """The twin's RDMA device when it qualifies as a rail, else None; and why."""
    hca = _rdma_device(twin, sysfs)
    if hca is None:
        return None, f"{twin} has no RDMA device"
    if _netdev_down(twin, sysfs) or _port_state(hca, sysfs) not in ("", _ACTIVE):
        return None, f"{twin} ({hca}) is down"
    interface = _ipv4_interface(twin, run)
    if interface is None:
        return None, f"{twin} ({hca}) has no IPv4 address"
    gid, kind = _gid_type_at(hca, gid_index, sysfs)
    wanted = ipaddress.IPv6Address(f"::ffff:{interface.ip}").exploded
    if gid != wanted or kind.lower() != "roce v2":
        return None, (
            f"{hca} has no RoCE v2 GID for {interface.ip} at index {gid_index}"
            " (NCCL uses one GID index on every rail)"
        )
    if not ping:
        return hca, f"{twin} ({hca}) not pinged (--no-ping)"
    mtu = int(report.facts.get("mtu", 1500))
    target = _twin_target(interface, ipaddress.IPv4Address(report.facts["address"]), peer)
    result = run(
        [
            "ping",
            "-c",
            "2",
            "-W",
            "2",
            "-I",
            twin,
            "-M",
            "do",
            "-s",
            str(mtu - IP_ICMP_OVERHEAD),
            "-q",
            str(target),
        ]
    )
    if result.returncode != 0:
        return None, (
            f"{twin} ({hca}, {interface.ip}) does not reach {target} with a {mtu}-byte"
            " unfragmentable ping: NOT used, running on fewer rails"
        )
    return hca, f"{twin} ({hca}, {interface.ip}) reaches {target} at MTU {mtu}"


def nccl_environment(netdev: str, rails: list[str], gid_index: int) -> dict[str, str]:
    """The NCCL variables for this link, as TensorFold's ranks get them."""
    return {
        "NCCL_SOCKET_IFNAME": netdev,
        "NCCL_IB_HCA": ",".join(rails),
        "NCCL_IB_GID_INDEX": str(gid_index),
    }


def add_rails(settings: Settings, report: Report, *, sysfs: Path, run: Runner, ping: bool = True) -> None:
    """After the ``rdma`` check passed: prove the link is up, add the twin rail, write the NCCL facts."""
    dev, hcas, gid_index = report.facts["netdev"], report.facts["rdma_devices"], report.facts["gid_index"]
    if not _check_link(dev, hcas[0], sysfs, report):
        return
    rails = list(hcas)
    twin = twin_netdev(dev, sysfs)
    if twin is None:
        detail = f"1 rail ({hcas[0]}): {dev} has no PCIe twin"
    else:
        assert settings.fabric.peer is not None  # discover() stops earlier without a peer
        hca, why = _twin_rail(twin, gid_index, report, settings.fabric.peer, sysfs=sysfs, run=run, ping=ping)
        if hca is not None and hca not in rails:
            rails.append(hca)
        detail = f"{len(rails)} rail(s) ({', '.join(rails)}): {why}"
    configured = settings.fabric.rdma_devices
    if configured:
        rails = [hca for hca in configured if hca in rails] or rails
    report.facts.update(rdma_devices=rails, nccl=nccl_environment(dev, rails, gid_index))
    report.add(Check("rails", True, detail))


def fabric_facts(report: Report | dict[str, Any]) -> FabricFacts | None:
    """The engine's view of a fabric report (``sparkfold fabric --json``'s ``facts``); None if incomplete."""
    facts = report.facts if isinstance(report, Report) else report
    nccl = facts.get("nccl")
    if not nccl:
        return None
    return FabricFacts(
        nccl["NCCL_SOCKET_IFNAME"],
        tuple(nccl["NCCL_IB_HCA"].split(",")),
        int(nccl["NCCL_IB_GID_INDEX"]),
    )
