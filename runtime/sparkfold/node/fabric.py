"""``sparkfold fabric``: find the link to the peer rank and prove it carries full-size frames.

Discovery, in order (each step one :class:`~sparkfold.node.checks.Check`):

1. ``route``: ``ip -j -4 route get <fabric.peer>`` names the netdev and source address; the peer must be
   reached directly (no gateway) and, when ``fabric.address`` is set, from that address.
2. ``mtu``: the netdev's MTU (``ip -j link show``, netlink) equals ``fabric.mtu``.
3. ``ping``: a full-size unfragmentable ping (``-M do -s <mtu - 28>``) from the netdev reaches the peer.
4. ``rdma``: the netdev's RDMA (verbs) device, and the RoCE v2 GID index whose GID is the IPv4-mapped
   link address (an all-zero or v1 entry makes NCCL fail a minute in). A configured ``fabric.gid_index``
   or ``fabric.rdma_devices`` must agree with what is found. A node without ``<sysfs>/class/infiniband``
   fails it when the ranks use RDMA (the tensorfold engine with ``engine.tensorfold.rdma``, its
   default), naming the netdev; else (the CPU engines, the testbed's stand-in) it is skipped.

The facts found (``netdev``, ``address``, ``mtu``, ``rdma_devices``, ``gid_index``) feed the runtime
configuration. Once the RDMA device is found, :func:`sparkfold.node.roce.add_rails` checks the link is
up, adds the port's PCIe twin as a second rail and writes the NCCL facts.
``sysfs`` is a parameter so tests can hand a fake tree.

:func:`discover_settled` repeats the discovery, bounded by ``settle_s``, until it passes: right after
``netplan apply`` (which returns before networkd has configured the link) the address, the route
and the RoCE GIDs appear a few seconds late, and a single look would fail a link that is fine.
"""

from __future__ import annotations

import ipaddress
import json
import time
from collections.abc import Callable
from pathlib import Path

from sparkfold.config import Settings
from sparkfold.node.checks import Check, Report, Runner, run_command
from sparkfold.node.roce import add_rails

__all__ = ["DEFAULT_SYSFS", "discover", "discover_settled", "ipv4_mapped_gid", "roce_v2_gid_index"]

DEFAULT_SYSFS = Path("/sys")
IP_ICMP_OVERHEAD = 28  # IPv4 header (20) + ICMP header (8)
_NO_ROUTE_FIX = "check both ends are addressed (ip -4 addr) and that fabric.peer is the peer's link address"


def ipv4_mapped_gid(address: ipaddress.IPv4Address) -> str:
    """The GID sysfs shows for an IPv4 address on a RoCE port (``::ffff:a.b.c.d``, fully expanded)."""
    return ipaddress.IPv6Address(f"::ffff:{address}").exploded


def roce_v2_gid_index(port: Path, address: ipaddress.IPv4Address) -> int | None:
    """Index of the RoCE v2 GID on ``port`` (``…/ports/<n>``) that holds ``address``, if any."""
    wanted = ipv4_mapped_gid(address)
    gids = port / "gids"
    if not gids.is_dir():
        return None
    for entry in sorted(gids.iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else -1):
        try:
            gid = entry.read_text(encoding="utf-8").strip()
            kind = (port / "gid_attrs" / "types" / entry.name).read_text(encoding="utf-8").strip()
        except OSError:  # unset entries cannot be read on a real port
            continue
        if gid == wanted and kind.lower() == "roce v2":
            return int(entry.name)
    return None


def _route(peer: ipaddress.IPv4Address, run: Runner) -> dict[str, str] | None:
    result = run(["ip", "-j", "-4", "route", "get", str(peer)])
    if result.returncode != 0:
        return None
    try:
        routes = json.loads(result.stdout)
    except json.JSONDecodeError:
        return None
    return routes[0] if routes else None


def _check_route(settings: Settings, report: Report, run: Runner) -> str | None:
    peer, address = settings.fabric.peer, settings.fabric.address
    assert peer is not None
    route = _route(peer, run)
    if route is None or "dev" not in route:
        report.add(Check("route", False, f"no route from this node to {peer}", _NO_ROUTE_FIX))
        return None
    dev, source = route["dev"], route.get("prefsrc", "")
    report.facts.update(netdev=dev, address=source, peer=str(peer))
    if route.get("type") == "local" or dev == "lo":
        report.add(
            Check("route", False, f"{peer} is this node's own address", "set fabric.peer to the OTHER end")
        )
        return None
    if "gateway" in route:
        report.add(
            Check(
                "route",
                False,
                f"{peer} is reached through the gateway {route['gateway']} on {dev}, not over a direct link",
                "address the link netdevs of both nodes in one subnet,"
                " or set fabric.peer to the peer's link address",
            )
        )
        return None
    if address is not None and source != str(address):
        report.add(
            Check(
                "route",
                False,
                f"{peer} is reached over {dev} from {source or 'no address'},"
                f" not from fabric.address {address}",
                "put fabric.address on the link netdev, or correct fabric.address / fabric.peer",
            )
        )
        return None
    report.add(Check("route", True, f"{peer} over {dev} from {source}"))
    return dev


def _link_mtu(dev: str, run: Runner) -> int | None:
    # Over netlink, not sysfs: sysfs can show another network namespace's netdevs (containers).
    result = run(["ip", "-j", "link", "show", "dev", dev])
    if result.returncode != 0:
        return None
    try:
        return int(json.loads(result.stdout)[0]["mtu"])
    except (json.JSONDecodeError, IndexError, KeyError, TypeError, ValueError):
        return None


def _check_mtu(settings: Settings, dev: str, report: Report, run: Runner) -> int | None:
    mtu = _link_mtu(dev, run)
    if mtu is None:
        report.add(
            Check("mtu", False, f"cannot read the MTU of {dev}", f"check `ip link show dev {dev}` works")
        )
        return None
    report.facts["mtu"] = mtu
    want = settings.fabric.mtu
    if mtu != want:
        report.add(
            Check(
                "mtu",
                False,
                f"{dev} has MTU {mtu}, fabric.mtu is {want}",
                f"set MTU {want} on the link netdev of BOTH nodes (ip link set {dev} mtu {want}),"
                " or change fabric.mtu",
            )
        )
        return None
    report.add(Check("mtu", True, f"{dev} MTU {mtu}"))
    return mtu


def _check_ping(settings: Settings, dev: str, mtu: int, report: Report, run: Runner) -> None:
    peer = str(settings.fabric.peer)
    size = mtu - IP_ICMP_OVERHEAD
    result = run(["ping", "-c", "2", "-W", "2", "-I", dev, "-M", "do", "-s", str(size), "-q", peer])
    if result.returncode == 0:
        report.add(Check("ping", True, f"{mtu}-byte unfragmentable ping from {dev} to {peer}"))
        return
    report.add(
        Check(
            "ping",
            False,
            f"a {mtu}-byte unfragmentable ping from {dev} to {peer} failed",
            "check the cable, that the peer's link netdev is up with the same MTU,"
            " and that no firewall drops ICMP",
        )
    )


def _uses_rdma(settings: Settings) -> bool:
    """The ranks talk RDMA: the tensorfold engine with its RDMA path on (``engine.tensorfold.rdma``)."""
    return settings.engine.kind == "tensorfold" and settings.engine.tensorfold.rdma


def _check_rdma(settings: Settings, dev: str, sysfs: Path, report: Report) -> None:
    if not (sysfs / "class/infiniband").is_dir():
        if _uses_rdma(settings):
            report.add(
                Check(
                    "rdma",
                    False,
                    f"{dev} has no verbs device: {sysfs / 'class/infiniband'} does not exist, and the"
                    " tensorfold ranks use RDMA (engine.tensorfold.rdma)",
                    "load the RoCE driver (modprobe mlx5_ib; `rdma link` should list the port) or, where"
                    " the ranks use no RDMA, set engine.tensorfold.rdma = false",
                )
            )
            return
        report.add(Check("rdma", True, "no RDMA devices on this node (sockets only)", skipped=True))
        return
    hint = (
        f"is {dev} the CX7 port between the nodes? Set fabric.peer to the peer's CX7 address "
        "and check the link address is on that port (ip -4 addr)"
    )
    hca_dir = sysfs / "class/net" / dev / "device/infiniband"
    hcas = sorted(p.name for p in hca_dir.iterdir()) if hca_dir.is_dir() else []
    address = ipaddress.IPv4Address(report.facts.get("address", ""))
    found: tuple[str, int] | None = None
    for hca in hcas:
        ports = sysfs / "class/infiniband" / hca / "ports"
        for port in sorted(ports.iterdir()) if ports.is_dir() else []:
            index = roce_v2_gid_index(port, address)
            if index is not None:
                found = (hca, index)
                break
        if found:
            break
    if found is None:
        what = f"RDMA device {', '.join(hcas)} has" if hcas else f"{dev} has no RDMA device and"
        report.add(
            Check("rdma", False, f"no RoCE device or RoCE v2 GID for the link: {what} no RoCE v2 GID", hint)
        )
        return
    hca, index = found
    report.facts.update(rdma_devices=[hca], gid_index=index)
    configured_gid, configured_devices = settings.fabric.gid_index, settings.fabric.rdma_devices
    if configured_gid is not None and configured_gid != index:
        report.add(
            Check(
                "rdma",
                False,
                f"fabric.gid_index is {configured_gid},"
                f" but the RoCE v2 GID index of {address} on {hca} is {index}",
                "remove fabric.gid_index (discovered at start) or set it to the found index",
            )
        )
        return
    if configured_devices and hca not in configured_devices:
        report.add(
            Check(
                "rdma",
                False,
                f"fabric.rdma_devices {configured_devices} does not include the link's device {hca}",
                "remove fabric.rdma_devices (discovered at start) or add the link's device",
            )
        )
        return
    report.add(Check("rdma", True, f"{hca} RoCE v2 GID index {index} holds {address}"))


def discover(
    settings: Settings, *, sysfs: Path = DEFAULT_SYSFS, run: Runner = run_command, ping: bool = True
) -> Report:
    """Discover and prove the link to ``fabric.peer``; stops at the first step that fails."""
    report = Report()
    if settings.fabric.peer is None:
        report.add(
            Check(
                "route", False, "fabric.peer is not set", "set fabric.peer to the other node's link address"
            )
        )
        return report
    dev = _check_route(settings, report, run)
    if dev is None:
        return report
    mtu = _check_mtu(settings, dev, report, run)
    if mtu is None:
        return report
    if ping:
        _check_ping(settings, dev, mtu, report, run)
    else:
        report.add(Check("ping", True, "not run (--no-ping)", skipped=True))
    _check_rdma(settings, dev, sysfs, report)
    if report.ok and "gid_index" in report.facts:
        add_rails(settings, report, sysfs=sysfs, run=run, ping=ping)
    return report


SETTLE_EVERY_S = 2.0


def discover_settled(
    settings: Settings,
    settle_s: float,
    *,
    sysfs: Path = DEFAULT_SYSFS,
    run: Runner = run_command,
    ping: bool = True,
    every_s: float = SETTLE_EVERY_S,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> Report:
    """:func:`discover`, again every ``every_s`` until it passes or ``settle_s`` is spent; the last report.

    ``facts["attempts"]`` says how many looks it took. ``settle_s = 0`` looks once.
    """
    deadline = clock() + settle_s
    attempts = 1
    report = discover(settings, sysfs=sysfs, run=run, ping=ping)
    while not report.ok and clock() + every_s <= deadline:
        sleep(every_s)
        attempts += 1
        report = discover(settings, sysfs=sysfs, run=run, ping=ping)
    report.facts["attempts"] = attempts
    return report
