"""node/ufw.py against ``ufw status verbose`` as Ubuntu 24.04's ufw 0.36 prints it."""

from __future__ import annotations

import pytest

from sparkfold.node.ufw import judge

HEAD = """Status: active
Logging: on (low)
Default: deny (incoming), allow (outgoing), disabled (routed)
New profiles: skip

To                         Action      From
--                         ------      ----
{rules}
22/tcp (v6)                ALLOW IN    Anywhere (v6)
"""
SSH = "22/tcp                     ALLOW IN    Anywhere"


def status(*rules: str) -> str:
    return HEAD.format(rules="\n".join([SSH, *rules]))


def test_inactive_ufw_filters_nothing() -> None:
    verdict = judge("Status: inactive\n", peer="203.0.113.2", gateway_port=8888)
    assert verdict.ok is None and verdict.line == "ufw inactive"


def test_default_deny_with_only_ssh_blocks_the_gateway_and_the_peer_and_says_what_to_run() -> None:
    verdict = judge(status(), peer="203.0.113.2", gateway_port=8888)
    assert verdict.ok is False
    assert verdict.line == (
        "ufw active (deny incoming) blocks the gateway port 8888/tcp and the peer 203.0.113.2"
        " (rendezvous, heartbeats, NCCL): run sudo ufw allow 8888/tcp and sudo ufw allow from 203.0.113.2"
    )


@pytest.mark.parametrize(
    "rules",
    [
        (
            "8888/tcp                   ALLOW IN    Anywhere",
            "Anywhere                   ALLOW IN    203.0.113.2",
        ),
        (
            "8000:9000/tcp              ALLOW IN    Anywhere",
            "Anywhere                   ALLOW IN    203.0.113.0/24",
        ),
    ],
)
def test_allowed_gateway_and_peer_pass(rules: tuple[str, str]) -> None:
    verdict = judge(status(*rules), peer="203.0.113.2", gateway_port=8888)
    assert verdict.ok is True and verdict.blocked == ()


def test_a_port_only_allow_of_the_rendezvous_is_not_enough_for_the_peer() -> None:
    """NCCL opens ports of its own: the peer needs an allow of its whole address."""
    rules = ("29551/tcp                  ALLOW IN    203.0.113.2",)
    verdict = judge(status(*rules), peer="203.0.113.2", gateway_port=None)
    assert verdict.ok is False and verdict.blocked == ("the peer 203.0.113.2 (rendezvous, heartbeats, NCCL)",)


def test_a_deny_before_the_allow_wins() -> None:
    rules = (
        "8888/tcp                   DENY IN     Anywhere",
        "8888/tcp                   ALLOW IN    Anywhere",
    )
    verdict = judge(status(*rules), peer=None, gateway_port=8888)
    assert verdict.ok is False and "sudo ufw allow 8888/tcp" in verdict.line
