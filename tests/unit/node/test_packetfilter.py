"""node/packetfilter.py against ``nft -j list ruleset`` (nftables 1.0's JSON, libnftables-json(5))
and ``iptables-save`` output of the shapes a DGX OS node carries: a drop-policy input chain with
the usual established/loopback/SSH rules, and rules that open what the pair needs."""

from __future__ import annotations

import json

import pytest
from node_fakes import dport, match, ruleset, saddr

from sparkfold.node.packetfilter import judge, needs_for, parse_iptables_save, parse_nft_json

PEER = "203.0.113.2"
HEAD_NEEDS = needs_for(peer=PEER, gateway_port=8888, engine_port=18888, link_netdev="enp1s0f1np1")


ESTABLISHED = match({"ct": {"key": "state"}}, ["established", "related"], "in")
LOOPBACK = match({"meta": {"key": "iif"}}, "lo")


USUAL = (
    [ESTABLISHED, {"accept": None}],
    [dport(22), {"counter": {"packets": 0, "bytes": 0}}, {"accept": None}],
)


def test_a_drop_policy_with_only_ssh_blocks_all_three_and_says_what_to_run() -> None:
    verdict = judge("nftables", parse_nft_json(ruleset(*USUAL)), HEAD_NEEDS)
    assert verdict.ok is False
    assert verdict.blocked == (
        "the gateway port 8888/tcp",
        f"the peer {PEER} (rendezvous, heartbeats, NCCL)",
        "the engine port 18888/tcp on loopback",
    )
    assert verdict.line.startswith(
        "nftables (inet filter input policy drop) blocks the gateway port 8888/tcp"
    )
    assert verdict.line.endswith(
        "run sudo nft insert rule inet filter input tcp dport 8888 accept and"
        f" sudo nft insert rule inet filter input ip saddr {PEER} accept and"
        " sudo nft insert rule inet filter input iif lo accept"
    )


def test_rules_that_open_the_gateway_the_peer_and_loopback_pass() -> None:
    opened = (
        *USUAL,
        [LOOPBACK, {"accept": None}],
        [dport({"set": [80, {"range": [8000, 8999]}]}), {"accept": None}],
        [saddr({"prefix": {"addr": "203.0.113.0", "len": 24}}), {"accept": None}],
    )
    verdict = judge("nftables", parse_nft_json(ruleset(*opened)), HEAD_NEEDS)
    assert verdict.ok is True
    assert verdict.line == "nftables (inet filter input policy drop) lets in what the pair needs"


def test_an_accept_policy_lets_everything_in_but_a_drop_rule_before_still_blocks() -> None:
    assert judge("nftables", parse_nft_json(ruleset(policy="accept")), HEAD_NEEDS).ok is True
    dropped = judge(
        "nftables", parse_nft_json(ruleset([dport(8888), {"drop": None}], policy="accept")), HEAD_NEEDS
    )
    assert dropped.ok is False and dropped.blocked == ("the gateway port 8888/tcp",)


def test_a_port_rule_does_not_open_every_port_to_the_peer_nor_a_source_rule_the_gateway() -> None:
    partial = (
        [saddr(PEER), dport(29551), {"accept": None}],  # the rendezvous only: NCCL's ports stay shut
        [saddr("198.51.100.0/24"), dport(8888), {"accept": None}],  # some clients, not any
        [LOOPBACK, {"accept": None}],
    )
    verdict = judge("nftables", parse_nft_json(ruleset(*partial)), HEAD_NEEDS)
    assert verdict.blocked == ("the gateway port 8888/tcp", f"the peer {PEER} (rendezvous, heartbeats, NCCL)")


def test_jumps_named_sets_and_the_link_netdev_are_followed() -> None:
    extra = [
        {"set": {"family": "inet", "name": "pair", "table": "filter", "type": "ipv4_addr", "elem": [PEER]}},
        {"chain": {"family": "inet", "table": "filter", "name": "sparkfold", "handle": 9}},
        {
            "rule": {
                "family": "inet",
                "table": "filter",
                "chain": "sparkfold",
                "expr": [dport(8888), {"accept": None}],
            }
        },
    ]
    rules = (
        [{"jump": {"target": "sparkfold"}}],
        [saddr("@pair"), {"accept": None}],
        [match({"meta": {"key": "iifname"}}, {"set": ["lo", "docker0"]}), {"accept": None}],
    )
    assert judge("nftables", parse_nft_json(ruleset(*rules, extra=extra)), HEAD_NEEDS).ok is True
    on_link = [match({"meta": {"key": "iifname"}}, "enp1s0f1np1"), {"accept": None}]
    link_only = judge("nftables", parse_nft_json(ruleset(on_link)), HEAD_NEEDS)
    assert f"the peer {PEER} (rendezvous, heartbeats, NCCL)" not in link_only.blocked


def test_ip6_rules_never_decide_for_ipv4_and_an_unread_match_says_may() -> None:
    ip6 = [match({"payload": {"protocol": "ip6", "field": "saddr"}}, "2001:db8::1"), {"accept": None}]
    xt = [{"xt": {"type": "match", "name": "addrtype"}}, {"accept": None}]
    verdict = judge("nftables", parse_nft_json(ruleset(ip6, xt, [LOOPBACK, {"accept": None}])), HEAD_NEEDS)
    assert verdict.ok is None
    assert "may block the gateway port 8888/tcp and the peer" in verdict.line
    assert "(rules it cannot read decide)" in verdict.line


def test_a_ruleset_without_an_input_chain_filters_nothing() -> None:
    docker_only = json.dumps(
        {
            "nftables": [
                {"table": {"family": "ip", "name": "nat", "handle": 2}},
                {
                    "chain": {
                        "family": "ip",
                        "table": "nat",
                        "name": "DOCKER",
                        "handle": 1,
                    }
                },
            ]
        }
    )
    verdict = judge("nftables", parse_nft_json(docker_only), HEAD_NEEDS)
    assert verdict.ok is None and verdict.line == "nftables: no input filter"


@pytest.mark.parametrize("text", ["", "not json", '{"other": []}', "[1, 2]"])
def test_text_that_is_not_nft_json_is_a_clear_error(text: str) -> None:
    with pytest.raises(ValueError, match="not nft's JSON"):
        parse_nft_json(text)


IPTABLES = """# Generated by iptables-save v1.8.10 (nf_tables) on Mon Nov 30 08:00:00 2026
*filter
:INPUT DROP [0:0]
:FORWARD DROP [0:0]
:OUTPUT ACCEPT [0:0]
:sparkfold - [0:0]
-A INPUT -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
-A INPUT -p tcp -m tcp --dport 22 -j ACCEPT
{rules}
COMMIT
# Completed on Mon Nov 30 08:00:00 2026
"""


def test_iptables_save_with_only_ssh_blocks_and_says_the_iptables_commands() -> None:
    verdict = judge("iptables", parse_iptables_save(IPTABLES.format(rules="")), HEAD_NEEDS)
    assert verdict.ok is False and len(verdict.blocked) == 3
    assert verdict.line.startswith("iptables (INPUT policy drop) blocks the gateway port 8888/tcp")
    assert verdict.line.endswith(
        "run sudo iptables -I INPUT -p tcp --dport 8888 -j ACCEPT and"
        f" sudo iptables -I INPUT -s {PEER} -j ACCEPT and sudo iptables -I INPUT -i lo -j ACCEPT"
    )


def test_iptables_save_rules_that_open_what_the_pair_needs_pass() -> None:
    rules = "\n".join(
        [
            "-A INPUT -i lo -j ACCEPT",
            "-A INPUT -j sparkfold",
            '-A sparkfold -p tcp -m multiport --dports 80,8000:8999 -m comment --comment "gateway" -j ACCEPT',
            f"-A sparkfold -s {PEER}/32 -j ACCEPT",
            "-A sparkfold -j RETURN",
        ]
    )
    verdict = judge("iptables", parse_iptables_save(IPTABLES.format(rules=rules)), HEAD_NEEDS)
    assert verdict.ok is True, verdict.line


def test_iptables_save_negation_and_a_worker_that_needs_only_the_peer() -> None:
    rules = f"-A INPUT ! -s {PEER}/32 -j DROP\n-A INPUT -j ACCEPT"
    worker = needs_for(peer=PEER, gateway_port=None, engine_port=None, link_netdev=None)
    assert judge("iptables", parse_iptables_save(IPTABLES.format(rules=rules)), worker).ok is True
    other = needs_for(peer="203.0.113.3", gateway_port=None, engine_port=None, link_netdev=None)
    assert judge("iptables", parse_iptables_save(IPTABLES.format(rules=rules)), other).ok is False


def test_an_entry_nft_would_never_print_is_a_clear_error() -> None:
    broken = json.dumps({"nftables": [{"chain": {"family": "inet", "name": "input"}}]})
    with pytest.raises(ValueError, match="not nft's JSON: an entry lacks 'table'"):
        parse_nft_json(broken)
