"""Would ufw block the pair? Read from ``ufw status verbose`` (DGX OS ships ufw, usually inactive).

What the pair needs in: on the head the gateway's port from anywhere its clients are (unless it
listens on loopback), and on both nodes everything from the peer's link address: the rendezvous
and heartbeat ports are known, but NCCL and TensorFold's ranks also open ports of their own, so only
an allow of the whole peer address (``ufw allow from <peer>``) is enough. ufw prints no machine
format, so its table is read here: the ``Default:`` line and the rules ``To  Action  From``.
"""

from __future__ import annotations

import ipaddress
import re

from sparkfold.node.firewall import FirewallVerdict

__all__ = ["judge"]

_RULE = re.compile(r"^(?P<to>\S.*?)\s{2,}(?P<action>ALLOW|DENY|REJECT|LIMIT)(?: IN)?\s{2,}(?P<src>\S.*?)\s*$")


def _covers(source: str, address: str) -> bool:
    """The rule's From names this address (itself, a network holding it, or Anywhere)."""
    if source == "Anywhere":
        return True
    try:
        return ipaddress.ip_address(address) in ipaddress.ip_network(source.split()[0], strict=False)
    except ValueError:
        return False


def _rules(status: str) -> list[tuple[str, str, str]]:
    found = []
    for line in status.splitlines():
        match = _RULE.match(line.strip())
        if match and "(v6)" not in line:
            found.append((match["to"], match["action"], match["src"]))
    return found


def _names_port(spec: str, port: int) -> bool:
    """``8888/tcp``, ``8888``, ``8000,8888/tcp`` or ``8000:9000/tcp`` names ``port`` (tcp or both)."""
    ports, _, proto = spec.partition("/")
    if proto not in ("", "tcp"):
        return False
    for part in ports.split(","):
        low, _, high = part.partition(":")
        if low.isdigit() and int(low) <= port <= int(high if high.isdigit() else low):
            return True
    return False


def _allows_port(rules: list[tuple[str, str, str]], port: int) -> bool:
    """The first rule from anywhere that takes ``port`` (or every port) allows it."""
    for to, action, source in rules:
        spec = to.split()[0]
        if source == "Anywhere" and (spec == "Anywhere" or _names_port(spec, port)):
            return action in ("ALLOW", "LIMIT")
    return False


def _allows_peer(rules: list[tuple[str, str, str]], peer: str) -> bool:
    for to, action, source in rules:
        if to.split()[0] == "Anywhere" and _covers(source, peer):
            return action == "ALLOW"  # ufw takes the first rule that matches
    return False


def judge(status: str, *, peer: str | None, gateway_port: int | None) -> FirewallVerdict:
    """What ``status`` (``ufw status verbose``) blocks of the pair's traffic, and what to run."""
    if "Status: active" not in status:
        return FirewallVerdict(None, "ufw inactive")
    default = re.search(r"^Default:\s*(\w+) \(incoming\)", status, re.MULTILINE)
    if default is None or default[1] == "allow":
        return FirewallVerdict(None, "ufw active, allows incoming by default")
    rules = _rules(status)
    blocked: list[str] = []
    fixes: list[str] = []
    if gateway_port is not None and not _allows_port(rules, gateway_port):
        blocked.append(f"the gateway port {gateway_port}/tcp")
        fixes.append(f"sudo ufw allow {gateway_port}/tcp")
    if peer is not None and not _allows_peer(rules, peer):
        blocked.append(f"the peer {peer} (rendezvous, heartbeats, NCCL)")
        fixes.append(f"sudo ufw allow from {peer}")
    if not blocked:
        return FirewallVerdict(
            True, f"ufw active ({default[1]} incoming); the gateway and the peer {peer} are allowed"
        )
    return FirewallVerdict(
        False,
        f"ufw active ({default[1]} incoming) blocks {' and '.join(blocked)}: run {' and '.join(fixes)}",
        tuple(blocked),
    )
