"""The verdict of a firewall judge: node/ufw.py reads ufw's own table, node/packetfilter.py the
nftables or iptables ruleset; ``sparkfold doctor``'s firewall section shows whichever decides."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FirewallVerdict"]


@dataclass(frozen=True)
class FirewallVerdict:
    """``ok``: True when what the pair needs gets in, False when something is blocked, None when
    the firewall filters nothing (ufw inactive or allowing by default, no input filter) or rules
    the judge cannot read decide; ``line``: one sentence with what to run; ``blocked``: the needs
    blocked (or maybe blocked, when ``ok`` is None)."""

    ok: bool | None
    line: str
    blocked: tuple[str, ...] = ()
