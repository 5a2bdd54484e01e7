"""Regenerate the packet-filter captures beside this file: real ``nft -j list ruleset``,
``iptables-save`` and ``ufw status verbose`` output for the rulesets node/packetfilter.py and
node/ufw.py judge (tests/unit/node/test_firewall_captures.py reads them).

Run as root on a Linux host with nftables, iptables (its nft and legacy backends) and iproute2::

    sudo python3 tests/unit/node/captures/capture.py [--ufw-deb ufw_0.36.2-1_all.deb]

Nothing touches the host's own firewall or /etc: each ruleset is loaded into a network namespace
of its own (``sffw-<scenario>``, deleted afterwards) and listed there. ufw runs from its unpacked
package (``dpkg-deb -x``, fetched with ``apt-get download ufw`` when ``--ufw-deb`` is not given)
with ``--rootdir``/``--datadir`` pointing into a temporary folder, inside a private mount namespace
with a tmpfs on /run (its lock file); the package's rules files are copied where its postinst puts
them, and its sysctl file is left out (no sysctl is written). Addresses are the documentation
ranges only: the peer is 203.0.113.2, clients 198.51.100.0/25, Docker's bridge 198.51.100.128/25.

The captures checked in were made on Debian 12 with nftables 1.0.6, iptables 1.8.9 (nf_tables and
legacy) and ufw 0.36.2 (the ufw release Ubuntu 24.04 and DGX OS ship; their nftables is 1.0.9 and
iptables 1.8.10, which list the same rules in the same shapes). Each scenario also leaves the rules
it loaded (``<scenario>.rules``, or the ufw commands run), so a reader can check the verdict the
tests assert against what was loaded.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

# INPUT as an admin writes it on a default-drop host: loopback, established, ICMP, SSH, then the
# pair's needs (the gateway 8888/tcp from any client, every port from the peer).
_INPUT_HEAD = """\
-A INPUT -i lo -j ACCEPT
-A INPUT -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
-A INPUT -p icmp -j ACCEPT
-A INPUT -p tcp -m tcp --dport 22 -j ACCEPT
"""
_OPEN = _INPUT_HEAD + "-A INPUT -p tcp -m tcp --dport 8888 -j ACCEPT\n-A INPUT -s 203.0.113.2/32 -j ACCEPT\n"
# The gateway opened to some clients only: any other client is dropped.
_SOME_CLIENTS = (
    _INPUT_HEAD
    + "-A INPUT -s 198.51.100.0/25 -p tcp -m tcp --dport 8888 -j ACCEPT\n"
    + "-A INPUT -s 203.0.113.2/32 -j ACCEPT\n"
)


def _iptables(input_rules: str, *, policy: str = "DROP", chains: str = "", rules: str = "") -> str:
    return (
        f"*filter\n:INPUT {policy} [0:0]\n:FORWARD DROP [0:0]\n:OUTPUT ACCEPT [0:0]\n{chains}"
        f"{input_rules}{rules}COMMIT\n"
    )


# Docker 27's chains with the default bridge (here 198.51.100.128/25) and one published port, as
# dockerd writes them, plus a DOCKER-USER rule of the kind Docker's docs suggest (only clients from
# one network reach containers). All of it is in the forward hook (and nat): none of it decides
# what the input hook lets in.
_DOCKER_NAT = """\
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:DOCKER - [0:0]
-A PREROUTING -m addrtype --dst-type LOCAL -j DOCKER
-A OUTPUT ! -d 127.0.0.0/8 -m addrtype --dst-type LOCAL -j DOCKER
-A POSTROUTING -s 198.51.100.128/25 ! -o docker0 -j MASQUERADE
-A POSTROUTING -s 198.51.100.130/32 -d 198.51.100.130/32 -p tcp -m tcp --dport 80 -j MASQUERADE
-A DOCKER -i docker0 -j RETURN
-A DOCKER ! -i docker0 -p tcp -m tcp --dport 8080 -j DNAT --to-destination 198.51.100.130:80
COMMIT
"""
_DOCKER_CHAINS = """\
:DOCKER - [0:0]
:DOCKER-ISOLATION-STAGE-1 - [0:0]
:DOCKER-ISOLATION-STAGE-2 - [0:0]
:DOCKER-USER - [0:0]
"""
_DOCKER_RULES = """\
-A FORWARD -j DOCKER-USER
-A FORWARD -j DOCKER-ISOLATION-STAGE-1
-A FORWARD -o docker0 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
-A FORWARD -o docker0 -j DOCKER
-A FORWARD -i docker0 ! -o docker0 -j ACCEPT
-A FORWARD -i docker0 -o docker0 -j ACCEPT
-A DOCKER -d 198.51.100.130/32 ! -i docker0 -o docker0 -p tcp -m tcp --dport 80 -j ACCEPT
-A DOCKER-ISOLATION-STAGE-1 -i docker0 ! -o docker0 -j DOCKER-ISOLATION-STAGE-2
-A DOCKER-ISOLATION-STAGE-1 -j RETURN
-A DOCKER-ISOLATION-STAGE-2 -o docker0 -j DROP
-A DOCKER-ISOLATION-STAGE-2 -j RETURN
-A DOCKER-USER ! -s 198.51.100.0/25 -i enP7s7 -j DROP
-A DOCKER-USER -j RETURN
"""

# nftables' own ruleset, the shape of Ubuntu's /etc/nftables.conf once opened: a named set for
# the pair, ports in an anonymous set.
_NFT = """\
table inet filter {
    set pair {
        type ipv4_addr
        elements = { 203.0.113.2 }
    }
    chain input {
        type filter hook input priority filter; policy drop;
        ct state invalid drop
        ct state { established, related } accept
        iif lo accept
        meta l4proto { icmp, ipv6-icmp } accept
        tcp dport { 22, 8888 } accept
        PEER
        counter comment "dropped by the policy"
    }
    chain forward {
        type filter hook forward priority filter; policy drop;
    }
    chain output {
        type filter hook output priority filter; policy accept;
    }
}
"""

# The gateway filter a fleet's pair head loads (roles/sparkfold_service/templates/gateway-filter.nft.j2)
# for a router host at 203.0.113.10 and sparkfold_pair_gateway_allow ["198.51.100.0/25"].
_FLEET_GATEWAY = """\
table inet sparkfold_gateway
delete table inet sparkfold_gateway
table inet sparkfold_gateway {
    set allowed4 {
        type ipv4_addr
        flags interval
        elements = { 203.0.113.10, 198.51.100.0/25 }
    }
    chain input {
        type filter hook input priority filter; policy accept;
        tcp dport 8888 iif "lo" accept
        tcp dport 8888 ip saddr @allowed4 accept
        tcp dport 8888 counter drop
    }
}
"""

# name: (how it is loaded, what is loaded, which listings are taken)
_NFT_AND_SAVE = ("nft", "iptables-save")
SCENARIOS: dict[str, tuple[str, str | list[list[str]], tuple[str, ...]]] = {
    "nft-open": ("nft", _NFT.replace("PEER", "ip saddr @pair accept"), ("nft",)),
    # The peer only on the rendezvous port: NCCL's own ports stay shut.
    "nft-peer-port": ("nft", _NFT.replace("PEER", "ip saddr @pair tcp dport 29551 accept"), ("nft",)),
    "fleet-gateway": ("nft", _FLEET_GATEWAY, ("nft",)),
    # The same on a node whose own filter lets the peer in on the rendezvous port only.
    "fleet-gateway-peer-port": (
        "nft",
        _NFT.replace("PEER", "ip saddr @pair tcp dport 29551 accept") + _FLEET_GATEWAY,
        ("nft",),
    ),
    "iptables-open": ("iptables", _iptables(_OPEN), _NFT_AND_SAVE),
    "iptables-some-clients": ("iptables", _iptables(_SOME_CLIENTS), _NFT_AND_SAVE),
    "docker-open": (
        "iptables",
        _DOCKER_NAT + _iptables(_OPEN, chains=_DOCKER_CHAINS, rules=_DOCKER_RULES),
        _NFT_AND_SAVE,
    ),
    "docker-accept": (
        "iptables",
        _DOCKER_NAT + _iptables("", policy="ACCEPT", chains=_DOCKER_CHAINS, rules=_DOCKER_RULES),
        _NFT_AND_SAVE,
    ),
    # Legacy iptables: its rules never show in nft's listing.
    "legacy-some-clients": ("legacy", _iptables(_SOME_CLIENTS), ("nft", "iptables-legacy-save")),
    "ufw-open": (
        "ufw",
        [
            ["default", "deny", "incoming"],
            ["allow", "22/tcp"],
            ["allow", "8888/tcp"],
            ["allow", "from", "203.0.113.2"],
            ["--force", "enable"],
        ],
        ("nft", "iptables-save", "ufw"),
    ),
    "ufw-peer-port": (
        "ufw",
        [
            ["default", "deny", "incoming"],
            ["allow", "22/tcp"],
            ["allow", "8888/tcp"],
            ["allow", "from", "203.0.113.2", "to", "any", "port", "29551", "proto", "tcp"],
            ["--force", "enable"],
        ],
        ("nft", "iptables-save", "ufw"),
    ),
}

_LISTINGS = {
    "nft": (["nft", "-j", "list", "ruleset"], "nft.json"),
    "iptables-save": (["iptables-nft-save"], "iptables-save"),
    "iptables-legacy-save": (["iptables-legacy-save"], "iptables-save"),
}
_LOADERS = {
    "nft": ["nft", "-f", "-"],
    "iptables": ["iptables-nft-restore"],
    "legacy": ["iptables-legacy-restore"],
}


def _run(argv: list[str], stdin: str | None = None) -> str:
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip()}")
    return done.stdout


def _ufw_root(deb: Path | None, scratch: Path) -> Path:
    """The ufw package unpacked under ``scratch``, its rules files where its postinst puts them."""
    scratch.mkdir(parents=True, exist_ok=True)
    if deb is None:
        _run(["sh", "-c", f"cd {scratch} && apt-get download ufw"])
        deb = next(scratch.glob("ufw_*.deb"))
    root = scratch / "ufw"
    _run(["dpkg-deb", "-x", str(deb), str(root)])
    for rules in (root / "usr/share/ufw/iptables").glob("*.rules"):
        shutil.copy(rules, root / "etc/ufw" / rules.name)
    shutil.copy(root / "usr/share/ufw/ufw.conf", root / "etc/ufw/ufw.conf")
    defaults = root / "etc/default/ufw"
    lines = [
        "IPT_SYSCTL=" if ln.startswith("IPT_SYSCTL=") else ln for ln in defaults.read_text().splitlines()
    ]
    defaults.write_text("".join(f"{ln}\n" for ln in lines))
    return root


def _ufw(netns: str, root: Path, args: list[str]) -> str:
    """``ufw args`` in ``netns`` and a private mount namespace, its files under ``root``."""
    ufw = (
        f"mount -t tmpfs sffw-run /run && PYTHONPATH={root}/usr/lib/python3/dist-packages"
        f' exec python3 {root}/usr/sbin/ufw --rootdir={root} --datadir={root} "$@"'
    )
    argv = ["ip", "netns", "exec", netns, "unshare", "--mount", "--propagation", "private"]
    return _run([*argv, "sh", "-c", ufw, "ufw", *args])


def capture(name: str, ufw_deb: Path | None, scratch: Path) -> None:
    how, what, listings = SCENARIOS[name]
    netns = f"sffw-{name}"
    _run(["ip", "netns", "add", netns])
    try:
        if how == "ufw":
            assert isinstance(what, list)
            root = _ufw_root(ufw_deb, scratch / name)
            for args in what:
                _ufw(netns, root, args)
            (HERE / f"{name}.rules").write_text("".join(f"ufw {' '.join(a)}\n" for a in what))
        else:
            assert isinstance(what, str)
            _run(["ip", "netns", "exec", netns, *_LOADERS[how]], what)
            (HERE / f"{name}.rules").write_text(what)
        for listing in listings:
            if listing == "ufw":
                (HERE / f"{name}.ufw-status").write_text(_ufw(netns, root, ["status", "verbose"]))
                continue
            argv, suffix = _LISTINGS[listing]
            (HERE / f"{name}.{suffix}").write_text(_run(["ip", "netns", "exec", netns, *argv]))
    finally:
        _run(["ip", "netns", "delete", netns])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ufw-deb", type=Path, help="ufw's .deb (default: apt-get download ufw)")
    parser.add_argument("scenario", nargs="*", help=f"default: all of {', '.join(SCENARIOS)}")
    args = parser.parse_args()
    unknown = sorted(set(args.scenario) - set(SCENARIOS))
    if unknown:
        parser.error(f"no scenario {', '.join(unknown)}; there are {', '.join(SCENARIOS)}")
    with tempfile.TemporaryDirectory(prefix="sffw-") as scratch:
        for name in args.scenario or SCENARIOS:
            capture(name, args.ufw_deb, Path(scratch))
            print(f"captured {name}")


if __name__ == "__main__":
    main()
