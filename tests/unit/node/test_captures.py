"""node/packetfilter.py and node/ufw.py against real listings: ``nft -j list ruleset``,
``iptables-save`` and ``ufw status verbose`` as the tools printed them for rulesets loaded in a
network namespace (captures/capture.py made them; captures/<scenario>.rules is what was loaded).
Each verdict asserted is the one a person reading those rules gives."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from sparkfold.node import ufw
from sparkfold.node.firewall import FirewallVerdict
from sparkfold.node.packetfilter import (
    FLEET_GATEWAY_TABLE,
    Need,
    judge,
    needs_for,
    parse_iptables_save,
    parse_nft_json,
)

CAPTURES = Path(__file__).parent / "captures"
PEER = "203.0.113.2"
HEAD_NEEDS = needs_for(peer=PEER, gateway_port=8888, engine_port=18888, link_netdev="enP7s7")
GATEWAY = "the gateway port 8888/tcp"
THE_PEER = f"the peer {PEER} (rendezvous, heartbeats, NCCL)"


def listing(name: str) -> tuple[str, str]:
    """The tool that printed capture ``name`` and its text."""
    text = (CAPTURES / name).read_text()
    return ("nftables" if name.endswith(".nft.json") else "iptables"), text


def verdict_of(name: str, needs: Sequence[Need] = HEAD_NEEDS) -> FirewallVerdict:
    tool, text = listing(name)
    chains = parse_nft_json(text) if tool == "nftables" else parse_iptables_save(text)
    return judge(tool, chains, needs)


@pytest.mark.parametrize(
    ("name", "where"),
    [
        ("nft-open.nft.json", "inet filter input policy drop"),
        ("iptables-open.nft.json", "ip filter INPUT policy drop"),
        ("iptables-open.iptables-save", "INPUT policy drop"),
        ("docker-open.nft.json", "ip filter INPUT policy drop"),
        ("docker-open.iptables-save", "INPUT policy drop"),
        ("docker-accept.nft.json", "ip filter INPUT policy accept"),
        ("docker-accept.iptables-save", "INPUT policy accept"),
        ("ufw-open.iptables-save", "INPUT policy drop"),
    ],
)
def test_rulesets_that_open_what_the_pair_needs_pass(name: str, where: str) -> None:
    verdict = verdict_of(name)
    tool = listing(name)[0]
    assert (verdict.ok, verdict.line) == (True, f"{tool} ({where}) lets in what the pair needs")


def test_dockers_forward_chains_are_listed_but_never_judge_what_comes_in() -> None:
    """FORWARD's drop policy and DOCKER-USER's drop of other clients are the forward hook's: a
    judge that walked them would block the gateway."""
    chains = {c.name: c for c in parse_nft_json(listing("docker-open.nft.json")[1])}
    assert {"ip filter DOCKER-USER", "ip filter FORWARD", "ip nat DOCKER"} <= set(chains)
    assert [name for name, c in chains.items() if c.policy is not None] == ["ip filter INPUT"]
    saved = {c.name: c for c in parse_iptables_save(listing("docker-accept.iptables-save")[1])}
    assert saved["DOCKER-USER"].rules[0].action == "drop" and saved["FORWARD"].policy is None


def test_a_peer_opened_on_the_rendezvous_port_only_is_blocked() -> None:
    verdict = verdict_of("nft-peer-port.nft.json")
    assert (verdict.ok, verdict.blocked) == (False, (THE_PEER,))
    assert verdict.line.endswith(f"run sudo nft insert rule inet filter input ip saddr {PEER} accept")


@pytest.mark.parametrize("name", ["iptables-some-clients.iptables-save", "legacy-some-clients.iptables-save"])
def test_a_gateway_opened_to_some_clients_is_blocked_for_the_others(name: str) -> None:
    verdict = verdict_of(name)
    assert (verdict.ok, verdict.blocked) == (False, (GATEWAY,))
    assert verdict.line.endswith("run sudo iptables -I INPUT -p tcp --dport 8888 -j ACCEPT")


def test_the_same_rules_listed_by_nft_hold_xt_matches_it_cannot_read_so_it_says_may() -> None:
    """iptables-nft writes ``-m conntrack`` as an ``xt`` match nft's JSON names without its
    arguments: the accept of RELATED,ESTABLISHED might have taken the gateway's clients."""
    verdict = verdict_of("iptables-some-clients.nft.json")
    assert (verdict.ok, verdict.blocked) == (None, (GATEWAY,))
    assert "may block the gateway port 8888/tcp (rules it cannot read decide)" in verdict.line


def test_legacy_iptables_rules_are_not_in_nfts_listing() -> None:
    verdict = verdict_of("legacy-some-clients.nft.json")
    assert (verdict.ok, verdict.line) == (None, "nftables: no input filter")


def test_ufws_chains_are_walked_through_its_not_local_check() -> None:
    """ufw-before-input jumps to ufw-not-local, which returns for a connection to a local address
    (``-m addrtype --dst-type LOCAL``) and drops the rest; the user's rules come after it."""
    assert verdict_of("ufw-open.iptables-save").ok is True
    peer_port = verdict_of("ufw-peer-port.iptables-save")
    assert (peer_port.ok, peer_port.blocked) == (False, (THE_PEER,))
    assert peer_port.line.endswith(f"run sudo iptables -I INPUT -s {PEER} -j ACCEPT")


@pytest.mark.parametrize("name", ["ufw-open.nft.json", "ufw-peer-port.nft.json"])
def test_ufws_chains_listed_by_nft_hold_xt_matches_so_it_says_may(name: str) -> None:
    """nft's JSON names ufw's addrtype and conntrack matches without their arguments: whether
    ufw-not-local returns or drops is not read there (iptables-save reads it)."""
    verdict = verdict_of(name)
    assert (verdict.ok, verdict.blocked) == (None, (GATEWAY, THE_PEER))


def test_a_worker_behind_ufw_needs_only_the_peer() -> None:
    worker = needs_for(peer=PEER, gateway_port=None, engine_port=None, link_netdev="enP7s7")
    assert verdict_of("ufw-open.iptables-save", worker).ok is True
    assert verdict_of("ufw-peer-port.iptables-save", worker).blocked == (THE_PEER,)


def test_ufws_own_table_of_the_same_rules_gives_the_same_verdicts() -> None:
    opened = ufw.judge((CAPTURES / "ufw-open.ufw-status").read_text(), peer=PEER, gateway_port=8888)
    assert opened.ok is True
    peer_port = ufw.judge((CAPTURES / "ufw-peer-port.ufw-status").read_text(), peer=PEER, gateway_port=8888)
    assert (peer_port.ok, peer_port.blocked) == (False, (THE_PEER,))
    assert peer_port.line.endswith(f"run sudo ufw allow from {PEER}")


FLEET = (
    "; who reaches the gateway port 8888/tcp is inet sparkfold_gateway's to say (the fleet's gateway filter)"
)


def test_the_fleets_gateway_filter_is_not_a_block_to_undo() -> None:
    """A fleet's pair head drops its gateway port for all but the router host and the sources it is
    given (docs/fleet.md): on purpose, so the doctor does not say to open it to any client."""
    verdict = verdict_of("fleet-gateway.nft.json")
    assert (verdict.ok, verdict.line) == (
        True,
        f"nftables (inet sparkfold_gateway input policy accept) lets in what the pair needs{FLEET}",
    )


def test_the_table_is_the_one_the_service_role_loads() -> None:
    template = Path(__file__).parents[3] / "roles/sparkfold_service/templates/gateway-filter.nft.j2"
    assert f"\ntable {FLEET_GATEWAY_TABLE} {{\n" in template.read_text()


@pytest.mark.parametrize(
    ("source", "verdict"), [("203.0.113.10", True), ("198.51.100.7", True), ("198.51.100.200", False)]
)
def test_the_fleets_filter_lets_in_its_interval_set(source: str, verdict: bool) -> None:
    """The set of allowed sources (flags interval: an address and a network) is read."""
    client = Need(
        "a client", source, 8888, "enP7s7", "tcp dport 8888 accept", "-p tcp --dport 8888 -j ACCEPT"
    )
    assert verdict_of("fleet-gateway.nft.json", [client]).ok is verdict


def test_beside_the_fleets_filter_the_nodes_own_rules_still_judge_the_peer() -> None:
    verdict = verdict_of("fleet-gateway-peer-port.nft.json")
    assert (verdict.ok, verdict.blocked) == (False, (THE_PEER,))
    assert verdict.line.startswith(
        "nftables (inet filter input policy drop, inet sparkfold_gateway input policy accept) blocks the peer"
    )
    assert verdict.line.endswith(f"run sudo nft insert rule inet filter input ip saddr {PEER} accept{FLEET}")


def test_every_capture_is_read_by_a_test_here() -> None:
    """A capture the script makes and no test reads would be a fixture nobody checks."""
    source = Path(__file__).read_text()
    made = sorted(p.name for p in CAPTURES.iterdir() if p.suffix not in (".py", ".rules"))
    assert [name for name in made if name not in source] == []
