"""``sparkfold doctor`` against a scripted host, a fake sysfs and /proc: every section, never raising."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from node_fakes import FakeHost, add_roce_port, dport, ruleset

from sparkfold.cli import main
from sparkfold.node.doctor import Doctor, as_dict, as_table, redact
from sparkfold.weights import build_manifest, default_manifest_path, write_manifest

GID = "0000:0000:0000:0000:0000:ffff:cb00:7101"  # ::ffff:203.0.113.1
SECRET = "hf_abcdefghijklmnopqrstuvwx"


@pytest.fixture
def node(tmp_path: Path, host: FakeHost) -> Doctor:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    write_manifest(build_manifest(model), default_manifest_path(model))
    config = tmp_path / "sparkfold.toml"
    config.write_text(
        f'[engine]\nkind = "tensorfold"\nmodel = "{model}"\n'
        '[fabric]\naddress = "203.0.113.1"\npeer = "203.0.113.2"\n'
        f'[paths]\nstate_dir = "{tmp_path / "state"}"\n'
    )
    sysfs, proc = tmp_path / "sys", tmp_path / "proc"
    add_roce_port(sysfs, "enp1s0f1np1", "rocep1s0f1", {3: (GID, "RoCE v2")})
    proc.mkdir()
    (proc / "meminfo").write_text("MemTotal:       125000000 kB\nMemAvailable:   117440512 kB\n")
    host.answer(
        ["ip", "-j", "-4", "route", "get"],
        0,
        [{"dst": "203.0.113.2", "dev": "enp1s0f1np1", "prefsrc": "203.0.113.1"}],
    )
    host.answer(["ip", "-j", "link", "show"], 0, [{"ifname": "enp1s0f1np1", "mtu": 9000, "operstate": "UP"}])
    host.answer(
        ["ufw", "status", "verbose"], 0, "Status: active\nDefault: deny (incoming), allow (outgoing)\n"
    )
    host.answer(["nvidia-smi"], 0, "NVIDIA GB10, 580.95, 1024 MiB, 122000 MiB\n")
    host.answer(["docker", "version"], 0, "28.1.1\n")
    host.answer(["docker", "image", "inspect"], 0, "0123456789ab\n")
    host.answer(["systemctl", "is-active", "sparkfold-engine"], 0, "active\n")
    host.answer(["systemctl", "is-active", "sparkfold-api"], 3, "inactive\n")
    host.answer(["systemctl", "show"], 0, "4242\n")
    host.answer(["journalctl"], 0, f"2026-11-30T08:00:00 spark sparkfold[1]: login failed token={SECRET}\n")
    return Doctor(config, sysfs=sysfs, proc=proc, run=host)


def sections(doctor: Doctor) -> dict[str, dict[str, object]]:
    return as_dict(doctor.gather())["sections"]


def test_every_section_is_gathered_from_a_healthy_node(node: Doctor, host: FakeHost) -> None:
    found = sections(node)
    assert list(found) == [
        "version",
        "config",
        "fabric",
        "rdma",
        "netdevs",
        "firewall",
        "memory",
        "gpu",
        "docker",
        "weights",
        "units",
        "errors",
    ]
    assert found["config"]["ok"] is True and len(found["config"]["data"]["engine_fingerprint"]) == 64
    assert found["fabric"]["ok"] is True and found["fabric"]["data"]["facts"]["gid_index"] == 3
    assert not any(call[0] == "ping" for call in host.calls), "doctor never pings"
    assert found["rdma"]["data"]["devices"]["rocep1s0f1"]["1"]["gids"] == {"3": f"{GID} RoCE v2"}
    assert found["firewall"]["ok"] is False and found["firewall"]["summary"].endswith(
        "run sudo ufw allow 8888/tcp and sudo ufw allow from 203.0.113.2"
    )
    memory = found["memory"]["data"]
    assert (memory["total_gib"], memory["available_gib"], memory["guard_kills"]) == (119.2, 112.0, 0)
    assert found["memory"]["ok"] is True and "budget: " in found["memory"]["summary"]
    assert found["gpu"]["summary"].startswith("NVIDIA GB10")
    assert found["docker"]["data"]["label"] == "0123456789ab"
    assert found["weights"]["ok"] is True and found["weights"]["data"]["mode"] == "sizes"
    units = found["units"]["data"]["units"]
    assert units["sparkfold-engine"] == {"active": "active", "main_pid": "4242"}
    assert units["sparkfold-api"]["active"] == "inactive"
    assert found["errors"]["ok"] is False and len(found["errors"]["data"]["lines"]) == 1


def test_secrets_never_appear(node: Doctor) -> None:
    text = json.dumps(as_dict(node.gather())) + as_table(node.gather())
    assert SECRET not in text and "token=<redacted>" in text
    assert redact("Authorization: Bearer sk-abcdefghijkl") == "Authorization: Bearer <redacted>"


def test_missing_tools_are_facts_not_errors(tmp_path: Path) -> None:
    doctor = Doctor(tmp_path / "absent.toml", sysfs=tmp_path, proc=tmp_path, run=FakeHost())
    found = sections(doctor)
    assert found["config"]["ok"] is False and "cannot read" in found["config"]["summary"]
    assert found["fabric"]["summary"] == "skipped: needs a valid config"
    assert found["gpu"]["ok"] is None and "command not found" in found["gpu"]["summary"]
    assert found["docker"]["ok"] is None and found["units"]["ok"] is None
    assert found["memory"]["ok"] is False


def test_a_probe_that_raises_becomes_a_failed_section(node: Doctor, monkeypatch: pytest.MonkeyPatch) -> None:
    def boom() -> None:
        raise RuntimeError("sysfs vanished")

    monkeypatch.setattr(node, "rdma", boom)
    found = sections(node)
    assert found["rdma"] == {"ok": False, "summary": "probe failed: RuntimeError: sysfs vanished", "data": {}}
    assert found["errors"]["summary"] == "1 recent error line(s)"


def test_weights_that_differ_fail_the_section(node: Doctor) -> None:
    assert node.config is not None
    (Path(node.config).parent / "model/config.json").write_text("{ }")
    found = sections(node)
    assert found["weights"]["ok"] is False and "wrong size" in found["weights"]["summary"]


def test_command_prints_a_table_and_json(tmp_path: Path) -> None:
    absent = str(tmp_path / "absent.toml")
    table = CliRunner().invoke(
        main, ["doctor", "--config", absent, "--sysfs-root", str(tmp_path), "--timeout", "5"]
    )
    assert table.exit_code == 0, table.output
    assert "FAIL config" in table.output and "version" in table.output
    raw = CliRunner().invoke(main, ["doctor", "--config", absent, "--json", "--timeout", "5"])
    assert raw.exit_code == 0 and "sections" in json.loads(raw.output)


DROP_ALL_BUT_SSH = ruleset([dport(22), {"accept": None}])


def test_without_an_active_ufw_the_nftables_ruleset_is_judged(node: Doctor, host: FakeHost) -> None:
    host.answer(["ufw", "status", "verbose"], 0, "Status: inactive\n")
    host.answer(["nft", "-j", "list", "ruleset"], 0, DROP_ALL_BUT_SSH)
    firewall = sections(node)["firewall"]
    assert firewall["ok"] is False
    assert firewall["summary"].startswith("ufw inactive; nftables (inet filter input policy drop) blocks")
    assert firewall["data"]["blocked"] == [
        "the gateway port 8888/tcp",
        "the peer 203.0.113.2 (rendezvous, heartbeats, NCCL)",
        "the engine port 18888/tcp on loopback",
    ]


def test_without_nft_iptables_save_is_judged(node: Doctor, host: FakeHost) -> None:
    del host.answers[("ufw", "status", "verbose")]
    host.answer(["iptables-save"], 0, "*filter\n:INPUT ACCEPT [0:0]\nCOMMIT\n")
    firewall = sections(node)["firewall"]
    assert firewall["ok"] is True
    assert firewall["summary"] == "no ufw; iptables (INPUT policy accept) lets in what the pair needs"


@pytest.mark.parametrize(
    ("rc", "stdout", "said"),
    [
        (1, "", "nft: exit code 1 (run sparkfold doctor with sudo)"),
        (0, "[]", "nft: not nft's JSON: no nftables list"),
    ],
)
def test_a_ruleset_it_cannot_read_is_a_fact(
    node: Doctor, host: FakeHost, rc: int, stdout: str, said: str
) -> None:
    """Without root nft cannot list the ruleset (Operation not permitted): said, never raised."""
    del host.answers[("ufw", "status", "verbose")]
    host.answer(["nft", "-j", "list", "ruleset"], rc, stdout)
    firewall = sections(node)["firewall"]
    assert firewall == {"ok": None, "summary": f"no ufw; {said}", "data": {}}


def test_no_packet_filter_tool_at_all(node: Doctor, host: FakeHost) -> None:
    del host.answers[("ufw", "status", "verbose")]
    firewall = sections(node)["firewall"]
    assert firewall == {"ok": None, "summary": "no ufw; no nft or iptables on this node", "data": {}}


def test_rules_nft_lists_as_xt_matches_are_read_from_iptables_save(node: Doctor, host: FakeHost) -> None:
    """iptables-nft writes conntrack as an ``xt`` match that nft's JSON does not spell out: the
    verdict then comes from iptables-save, which reads it."""
    del host.answers[("ufw", "status", "verbose")]
    xt = {"xt": {"type": "match", "name": "conntrack"}}
    host.answer(["nft", "-j", "list", "ruleset"], 0, ruleset([xt, {"accept": None}]))
    host.answer(
        ["iptables-save"],
        0,
        "*filter\n:INPUT DROP [0:0]\n-A INPUT -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\n"
        "-A INPUT -i lo -j ACCEPT\n-A INPUT -p tcp -m tcp --dport 8888 -j ACCEPT\nCOMMIT\n",
    )
    firewall = sections(node)["firewall"]
    assert firewall["ok"] is False
    assert firewall["summary"].startswith("no ufw; iptables (INPUT policy drop) blocks the peer 203.0.113.2")
    assert firewall["data"]["blocked"] == ["the peer 203.0.113.2 (rendezvous, heartbeats, NCCL)"]


CAPTURES = Path(__file__).parent / "captures"


@pytest.mark.parametrize("scenario", ["legacy-some-clients", "iptables-some-clients"])
def test_iptables_save_decides_where_nft_lists_no_filter_or_cannot_read_it(
    node: Doctor, host: FakeHost, scenario: str
) -> None:
    """Real listings (captures/): legacy iptables' rules are not in nft's ruleset at all, and
    iptables-nft's conntrack match is an ``xt`` nft does not spell out; iptables-save reads both."""
    del host.answers[("ufw", "status", "verbose")]
    host.answer(["nft", "-j", "list", "ruleset"], 0, (CAPTURES / f"{scenario}.nft.json").read_text())
    host.answer(["iptables-save"], 0, (CAPTURES / f"{scenario}.iptables-save").read_text())
    firewall = sections(node)["firewall"]
    assert firewall["ok"] is False
    assert firewall["summary"] == (
        "no ufw; iptables (INPUT policy drop) blocks the gateway port 8888/tcp:"
        " run sudo iptables -I INPUT -p tcp --dport 8888 -j ACCEPT"
    )


def test_a_kill_by_the_memory_guard_is_shown_with_what_to_change(node: Doctor, tmp_path: Path) -> None:
    record = tmp_path / "state/guard/memory-kills"
    record.parent.mkdir(parents=True)
    record.write_text("1765000000 4242 python3\n")
    memory = sections(node)["memory"]
    assert memory["ok"] is False and memory["data"]["guard_kills"] == 1
    assert (
        "the memory guard killed the engine 1 time(s): the memory guard killed the engine rank (pid 4242"
        in (memory["summary"])
    )
    assert "win back" in memory["data"]["last_kill"]
