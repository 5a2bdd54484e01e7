"""Would nftables or iptables rules block the pair? Read from ``nft -j list ruleset`` (nftables'
own machine format; DGX OS's iptables is its nft backend, so its rules are listed there too), or
from ``iptables-save`` where there is no ``nft`` (or legacy iptables holds the rules).

What the pair needs in is what node/ufw.py judges: on the head the gateway's port from any client
(unless it listens on loopback), on both nodes every port from the peer's link address (NCCL and
TensorFold's ranks open ports of their own besides the rendezvous), and on rank 0 the engine
server's port on loopback (the gateway reaches the engine there). Each need is one TCP connection
walked through the input hook's base chains the way the kernel does: in priority order, every base
chain must accept it, a chain's first matching rule decides, jumps and gotos are followed, the
chain's policy decides at its end. The gateway is not walked through the fleet's own gateway filter
(table ``inet sparkfold_gateway``, docs/fleet.md), which lets only the router host in on purpose.
A rule is read as covering a need only when it covers all of it (a rule for some sources does not
open the gateway to any client; a rule for some ports does not open every port to the peer). A
match this module does not read (an ``xt`` extension, marks, sets of concatenations ...) makes its
rule unknown: it is skipped, and a verdict that passed one says "may".

Written by hand because no maintained library judges a ruleset: the nftables Python binding
(``nftables.Nftables``) runs ``nft`` commands and returns the same JSON, and python-iptables edits
rules through libiptc; neither says whether a given connection would pass.
"""

from __future__ import annotations

import ipaddress
import json
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sparkfold.node.firewall import FirewallVerdict

__all__ = [
    "FLEET_GATEWAY_TABLE",
    "Chain",
    "Need",
    "Rule",
    "judge",
    "needs_for",
    "parse_iptables_save",
    "parse_nft_json",
]

_NEW_CONNECTION = "new"
# A fleet's pair head lets only the router host (and the sources it is given) reach its gateway
# port, from a table of its own (docs/fleet.md): there the gateway is not meant for any client.
FLEET_GATEWAY_TABLE = "inet sparkfold_gateway"
_MAX_DEPTH = 16


@dataclass(frozen=True)
class Match:
    """One condition: ``kind`` is saddr (networks), dport (port ranges), iif (netdev names), proto
    (protocol names), ctstate (conntrack states), daddrtype (address types of the destination,
    iptables' addrtype), or unknown; ``negate`` for ``!=`` / ``!``."""

    kind: str
    values: tuple[Any, ...] = ()
    negate: bool = False


@dataclass(frozen=True)
class Rule:
    """``action``: accept, drop, jump, goto, return, or None (a rule that only counts or logs)."""

    matches: tuple[Match, ...]
    action: str | None
    target: str | None = None


@dataclass
class Chain:
    """``policy`` is set on a base chain of the input hook (accept or drop), None on a regular one."""

    name: str
    rules: list[Rule] = field(default_factory=list)
    policy: str | None = None
    priority: int = 0
    where: str = ""  # how to name it in a command: "inet filter input" (nft) or "INPUT" (iptables)


@dataclass(frozen=True)
class Need:
    """A TCP connection the pair needs in: ``source`` None is any client, ``port`` None every port,
    ``iif`` None a netdev other than loopback that this module does not know."""

    name: str
    source: str | None
    port: int | None
    iif: str | None
    nft: str  # what to add in front of a dropping nft chain (the rule's matches and verdict)
    iptables: str  # the same for iptables (after ``-I <chain>``)


def needs_for(
    *, peer: str | None, gateway_port: int | None, engine_port: int | None, link_netdev: str | None
) -> list[Need]:
    """The connections a node needs in: the gateway port (head, public), every port from the peer,
    the engine server's port on loopback (rank 0)."""
    needs = []
    if gateway_port is not None:
        needs.append(
            Need(
                f"the gateway port {gateway_port}/tcp",
                None,
                gateway_port,
                None,
                f"tcp dport {gateway_port} accept",
                f"-p tcp --dport {gateway_port} -j ACCEPT",
            )
        )
    if peer is not None:
        needs.append(
            Need(
                f"the peer {peer} (rendezvous, heartbeats, NCCL)",
                peer,
                None,
                link_netdev,
                f"ip saddr {peer} accept",
                f"-s {peer} -j ACCEPT",
            )
        )
    if engine_port is not None:
        needs.append(
            Need(
                f"the engine port {engine_port}/tcp on loopback",
                "127.0.0.1",
                engine_port,
                "lo",
                "iif lo accept",
                "-i lo -j ACCEPT",
            )
        )
    return needs


def _covers(match: Match, need: Need) -> bool | None:
    """Does ``match`` hold for all of ``need`` (True), for none or only part of it (False), or is
    it not known (None)?"""
    held: bool | None
    if match.kind == "saddr":
        if need.source is None:  # any client: only a match naming no particular source covers it
            return not match.negate and any(net.prefixlen == 0 for net in match.values)
        held = any(ipaddress.ip_address(need.source) in net for net in match.values)
    elif match.kind == "dport":
        if need.port is None:  # every port: only a match of every port covers it
            return not match.negate and any(low <= 1 and high >= 65535 for low, high in match.values)
        held = any(low <= need.port <= high for low, high in match.values)
    elif match.kind == "iif":
        if need.iif is None:  # not loopback, but which netdev is not known
            return match.negate if set(match.values) == {"lo"} else None
        held = need.iif in match.values
    elif match.kind == "proto":
        held = "tcp" in match.values
    elif match.kind == "ctstate":
        held = _NEW_CONNECTION in match.values
    elif match.kind == "daddrtype":  # a connection in is to one of this node's own (unicast) addresses
        held = "LOCAL" in match.values
    else:
        return None
    return held != match.negate


def _rule_covers(rule: Rule, need: Need) -> bool | None:
    found: bool | None = True
    for match in rule.matches:
        held = _covers(match, need)
        if held is False:
            return False
        if held is None:
            found = None
    return found


def _walk(
    chains: Mapping[str, Chain], chain: Chain, need: Need, unsure: list[str], depth: int = 0
) -> str | None:
    """accept or drop where a rule of ``chain`` (or one it jumps to) decides, None where it returns."""
    if depth > _MAX_DEPTH:
        unsure.append(f"{chain.name}: jumps deeper than {_MAX_DEPTH}")
        return None
    for rule in chain.rules:
        covered = _rule_covers(rule, need)
        if covered is None and rule.action is not None:
            unsure.append(chain.name)
        if not covered or rule.action is None:
            continue
        if rule.action in ("accept", "drop"):
            return rule.action
        if rule.action == "return":
            return None
        target = chains.get(rule.target or "")
        if target is None:
            unsure.append(f"{chain.name}: jumps to {rule.target}, not listed")
            continue
        decided = _walk(chains, target, need, unsure, depth + 1)
        if decided is not None or rule.action == "goto":
            return decided
    return None


def _is_fleet_filter(chain: Chain) -> bool:
    return chain.where.startswith(f"{FLEET_GATEWAY_TABLE} ")


def judge(tool: str, chains: Sequence[Chain], needs: Iterable[Need]) -> FirewallVerdict:
    """What the input hook of ``chains`` (one ruleset of ``tool``: nftables or iptables) blocks of
    ``needs``, and what to run."""
    base = sorted((c for c in chains if c.policy is not None), key=lambda c: c.priority)
    if not base:
        return FirewallVerdict(None, f"{tool}: no input filter")
    by_name = {c.name: c for c in chains}
    blocked: list[str] = []
    maybe: list[str] = []
    fixes: list[str] = []
    fleet = ""
    # A need from any client (the gateway's) is not walked through the fleet's gateway filter.
    without_fleet = [c for c in base if not _is_fleet_filter(c)]
    for need in needs:
        unsure: list[str] = []
        walked = base
        if need.source is None and len(without_fleet) < len(base):
            walked = without_fleet
            fleet = (
                f"; who reaches {need.name} is {FLEET_GATEWAY_TABLE}'s to say (the fleet's gateway filter)"
            )
        dropped_by = next(
            (c for c in walked if (_walk(by_name, c, need, unsure) or c.policy) == "drop"), None
        )
        if dropped_by is None:
            continue
        (maybe if unsure else blocked).append(need.name)
        if tool == "nftables":
            fixes.append(f"sudo nft insert rule {dropped_by.where} {need.nft}")
        else:
            fixes.append(f"sudo iptables -I {dropped_by.where} {need.iptables}")
    policies = ", ".join(f"{c.where} policy {c.policy}" for c in base)
    if not blocked and not maybe:
        return FirewallVerdict(True, f"{tool} ({policies}) lets in what the pair needs{fleet}")
    said = []
    if blocked:
        said.append(f"blocks {' and '.join(blocked)}")
    if maybe:
        said.append(f"may block {' and '.join(maybe)} (rules it cannot read decide)")
    return FirewallVerdict(
        False if blocked else None,
        f"{tool} ({policies}) {'; '.join(said)}: run {' and '.join(fixes)}{fleet}",
        tuple(blocked + maybe),
    )


# --- nft -j list ruleset


def _nft_values(right: Any, sets: Mapping[str, list[Any]]) -> list[Any] | None:
    """The values a match's right side names (a named set looked up), None where not read."""
    if isinstance(right, str) and right.startswith("@"):
        return sets.get(right[1:])
    if isinstance(right, dict) and "set" in right:
        return list(right["set"])
    if isinstance(right, list):
        return list(right)
    return [right]


def _nft_network(value: Any) -> ipaddress.IPv4Network | None:
    try:
        if isinstance(value, dict) and "prefix" in value:
            prefix = value["prefix"]
            return ipaddress.IPv4Network(f"{prefix['addr']}/{prefix['len']}", strict=False)
        if isinstance(value, dict) and "range" in value:
            return None
        return ipaddress.IPv4Network(str(value))
    except (ValueError, KeyError, TypeError):
        return None


def _nft_ports(value: Any) -> tuple[int, int] | None:
    if isinstance(value, int):
        return (value, value)
    if isinstance(value, dict) and "range" in value and all(isinstance(v, int) for v in value["range"]):
        low, high = value["range"]
        return (low, high)
    return None


def _nft_match(expr: Mapping[str, Any], sets: Mapping[str, list[Any]]) -> Match | None:
    """One ``match`` expression as a Match; None where it can never hold for IPv4 TCP (an ip6 one)."""
    op, left, right = expr.get("op", "=="), expr.get("left"), expr.get("right")
    if op not in ("==", "!=", "in"):
        return Match("unknown")
    negate = op == "!="
    values = _nft_values(right, sets)
    if values is None or not isinstance(left, dict):
        return Match("unknown")
    payload, meta, ct = left.get("payload"), left.get("meta"), left.get("ct")
    if isinstance(payload, dict):
        protocol, name = payload.get("protocol"), payload.get("field")
        if protocol == "ip6":
            return None
        if protocol == "ip" and name == "saddr":
            nets = [_nft_network(v) for v in values]
            return Match("unknown") if None in nets else Match("saddr", tuple(nets), negate)
        if protocol == "ip" and name == "protocol":
            return Match("proto", tuple(str(v) for v in values), negate)
        if protocol in ("tcp", "th") and name == "dport":
            ports = [_nft_ports(v) for v in values]
            return Match("unknown") if None in ports else Match("dport", tuple(ports), negate)
        if protocol == "udp":
            return Match("proto", ("udp",))  # a udp header field: never a TCP connection
        return Match("unknown")
    if isinstance(meta, dict):
        key = meta.get("key")
        if key in ("iif", "iifname"):
            return Match("iif", tuple(str(v) for v in values), negate)
        if key == "l4proto":
            return Match("proto", tuple(str(v) for v in values), negate)
        if key == "nfproto":
            return None if "ipv6" in values and not negate and len(values) == 1 else Match("proto", ("tcp",))
        return Match("unknown")
    if isinstance(ct, dict) and ct.get("key") == "state":
        states = [s for v in values for s in (v if isinstance(v, list) else [v])]
        return Match("ctstate", tuple(str(s) for s in states), negate)
    return Match("unknown")


_NFT_IGNORED = {"counter", "log", "limit", "comment", "notrack", "meter"}


def _nft_rule(exprs: Sequence[Any], sets: Mapping[str, list[Any]]) -> Rule | None:
    """A rule's expressions as a Rule; None where it can never hold for an IPv4 connection."""
    matches: list[Match] = []
    for expr in exprs:
        kind, body = next(iter(expr.items())) if isinstance(expr, dict) and expr else ("", None)
        if kind == "match" and isinstance(body, dict):
            match = _nft_match(body, sets)
            if match is None:
                return None  # never an IPv4 connection
            matches.append(match)
        elif kind in ("accept", "drop", "reject", "return"):
            return Rule(tuple(matches), "drop" if kind == "reject" else kind)
        elif kind in ("jump", "goto") and isinstance(body, dict):
            return Rule(tuple(matches), kind, body.get("target"))
        elif kind not in _NFT_IGNORED:
            matches.append(Match("unknown"))
    return Rule(tuple(matches), None)


def parse_nft_json(text: str) -> list[Chain]:
    """The chains of the ip and inet tables in ``nft -j list ruleset``, named ``family table chain``;
    the filter chains on the input hook carry their policy. Raises ValueError on text that is not
    nft's JSON."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"not nft's JSON: {error}") from error
    items = data.get("nftables") if isinstance(data, dict) else None
    if not isinstance(items, list):
        raise ValueError("not nft's JSON: no nftables list")
    try:
        return _nft_chains(items)
    except (KeyError, TypeError, AttributeError, ValueError) as error:
        raise ValueError(f"not nft's JSON: an entry lacks {error}") from error


def _nft_chains(items: list[Any]) -> list[Chain]:
    chains: dict[str, Chain] = {}
    sets: dict[str, list[Any]] = {}
    for item in items:
        if not isinstance(item, dict):
            continue
        if "set" in item:
            body = item["set"]
            sets[body.get("name", "")] = list(body.get("elem", []))
        if "chain" in item:
            body = item["chain"]
            if body.get("family") not in ("ip", "inet"):
                continue
            where = f"{body['family']} {body['table']} {body['name']}"
            base = body.get("hook") == "input" and body.get("type") == "filter"
            chains[where] = Chain(
                where,
                policy=body.get("policy", "accept") if base else None,
                priority=int(body.get("prio", 0)) if base else 0,
                where=where,
            )
    for item in items:
        if isinstance(item, dict) and "rule" in item:
            body = item["rule"]
            if body.get("family") not in ("ip", "inet"):
                continue
            where = f"{body['family']} {body['table']} {body['chain']}"
            rule = _nft_rule(body.get("expr", []), sets)
            if rule is not None and where in chains:
                if rule.target is not None:
                    rule = Rule(rule.matches, rule.action, f"{body['family']} {body['table']} {rule.target}")
                chains[where].rules.append(rule)
    return list(chains.values())


# --- iptables-save


def _ipt_ports(spec: str) -> tuple[tuple[int, int], ...] | None:
    found = []
    for part in spec.split(","):
        low, _, high = part.partition(":")
        if not low.isdigit() or (high and not high.isdigit()):
            return None
        found.append((int(low), int(high or low)))
    return tuple(found)


def _ipt_rule(args: list[str]) -> Rule:
    matches: list[Match] = []
    action: str | None = None
    target: str | None = None
    negate = False
    index = 0
    while index < len(args):
        arg = args[index]
        value = args[index + 1] if index + 1 < len(args) else ""
        step = 2
        if arg == "!":
            negate, index = True, index + 1
            continue
        if arg in ("-s", "--source"):
            try:
                nets = tuple(ipaddress.IPv4Network(part, strict=False) for part in value.split(","))
                matches.append(Match("saddr", nets, negate))
            except ValueError:
                matches.append(Match("unknown"))
        elif arg in ("-p", "--protocol"):
            matches.append(Match("proto", (value,), negate))
        elif arg in ("--dport", "--destination-port", "--dports"):
            ports = _ipt_ports(value)
            matches.append(Match("dport", ports, negate) if ports else Match("unknown"))
        elif arg in ("-i", "--in-interface"):
            matches.append(Match("iif", (value,), negate))
        elif arg in ("--ctstate", "--state"):
            matches.append(Match("ctstate", tuple(value.lower().split(",")), negate))
        elif arg == "--dst-type":
            matches.append(Match("daddrtype", tuple(value.upper().split(",")), negate))
        elif arg in ("-j", "--jump", "-g", "--goto"):
            upper = value.upper()
            if upper in ("ACCEPT", "DROP", "REJECT", "RETURN"):
                action = {"REJECT": "drop"}.get(upper, upper.lower())
            elif upper in ("LOG", "NFLOG", "ULOG"):
                action = None
            else:
                action, target = ("goto" if arg in ("-g", "--goto") else "jump"), value
            step = len(args) - index  # a target's own options follow
        elif arg == "-m":
            if value not in ("tcp", "multiport", "conntrack", "state", "comment", "limit", "addrtype"):
                matches.append(Match("unknown"))
        elif arg == "--comment" or arg.startswith("--limit"):
            pass
        else:
            matches.append(Match("unknown"))
            step = 1
        negate = False
        index += step
    return Rule(tuple(matches), action, target)


def parse_iptables_save(text: str) -> list[Chain]:
    """The filter table's chains in ``iptables-save`` output; INPUT carries its policy."""
    chains: dict[str, Chain] = {}
    table = ""
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("*"):
            table = line[1:]
        elif table != "filter" or not line:
            continue
        elif line.startswith(":"):
            name, policy, *_ = [*line[1:].split(), "-"]
            chains[name] = Chain(name, policy=policy.lower() if name == "INPUT" else None, where=name)
        elif line.startswith("-A "):
            try:
                args = shlex.split(line)
            except ValueError:
                continue
            chain = chains.setdefault(args[1], Chain(args[1], where=args[1]))
            chain.rules.append(_ipt_rule(args[2:]))
    return list(chains.values())
