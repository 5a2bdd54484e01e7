"""``sparkfold doctor``: everything a bug report needs from one node, gathered without side effects.

Each probe is one section of the answer (version, config, fabric, rdma, netdevs, firewall, memory,
gpu, docker, weights, units, errors). A probe is bounded in time (every command runs under a
timeout) and never raises: a missing tool, an unreadable file or an exception becomes a fact of its
section (``ok`` is false and ``summary`` says why). Nothing is started, stopped, pinged or written.

No secret enters the answer: the configuration is represented by its path, its validity and its
engine fingerprint (never its content), and every string goes through :func:`redact`, which masks
tokens and keys that look like Hugging Face tokens, API keys or bearer credentials.
"""

from __future__ import annotations

import json
import platform
import re
import socket
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sparkfold import __commit_id__, __version__, lockfile
from sparkfold.config import ConfigError, Settings, engine_fingerprint, is_loopback, load
from sparkfold.node.budget import budget
from sparkfold.node.checks import Runner
from sparkfold.node.fabric import DEFAULT_SYSFS, discover
from sparkfold.node.firewall import FirewallVerdict
from sparkfold.node.guard import kill_line, kills_path, read_kills
from sparkfold.node.packetfilter import Need, needs_for, parse_iptables_save, parse_nft_json
from sparkfold.node.packetfilter import judge as judge_rules
from sparkfold.node.ufw import judge
from sparkfold.units import GIB

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "UNITS",
    "Doctor",
    "Section",
    "as_dict",
    "as_table",
    "bounded_runner",
    "redact",
]

DEFAULT_TIMEOUT_S = 10.0
UNITS = ("sparkfold-engine", "sparkfold-api")
JOURNAL_LINES = 20
_TOKEN = re.compile(r"\b(?:hf_[A-Za-z0-9]{8,}|sk-[A-Za-z0-9_-]{8,})")
_ASSIGNED = re.compile(r"(?i)\b(bearer|token|api[_-]?key|password)([=: ]+)(\S+)")


def redact(text: str) -> str:
    """``text`` with anything that looks like a token or key replaced by ``<redacted>``."""
    return _ASSIGNED.sub(r"\1\2<redacted>", _TOKEN.sub("<redacted>", text))


def _scrub(value: Any) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {key: _scrub(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_scrub(item) for item in value]
    return value


def bounded_runner(timeout_s: float = DEFAULT_TIMEOUT_S) -> Runner:
    """A probe runner: a missing tool reads as 127, a slow one is stopped and reads as 124."""

    def run(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s, check=False)
        except FileNotFoundError:
            return subprocess.CompletedProcess(list(argv), 127, "", "command not found")
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(
                list(argv), 124, "", f"{argv[0]}: timed out after {timeout_s:g} s"
            )

    return run


@dataclass
class Section:
    """One probe's answer: ``ok`` (None = not applicable), a one-line summary, and its data."""

    name: str
    ok: bool | None
    summary: str
    data: dict[str, Any] = field(default_factory=dict)


def _failed(result: subprocess.CompletedProcess[str]) -> str:
    text = (result.stderr or result.stdout).strip().splitlines()
    return text[-1] if text else f"exit code {result.returncode}"


@dataclass
class Doctor:
    """The probes, with their seams (config path, sysfs, /proc, command runner) open to tests."""

    config: Path | None
    sysfs: Path = DEFAULT_SYSFS
    proc: Path = Path("/proc")
    run: Runner = field(default_factory=bounded_runner)
    settings: Settings | None = None
    venv: Path | None = None  # the venv whose lock record to read (None: the running one)

    def gather(self) -> list[Section]:
        """Every section, in report order; a probe that raises becomes a failed section."""
        probes: list[tuple[str, Callable[[], Section]]] = [
            ("version", self.version),
            ("config", self.config_section),
            ("fabric", self.fabric),
            ("rdma", self.rdma),
            ("netdevs", self.netdevs),
            ("firewall", self.firewall),
            ("memory", self.memory),
            ("gpu", self.gpu),
            ("docker", self.docker),
            ("weights", self.weights),
            ("units", self.units),
            ("errors", self.errors),
        ]
        sections = []
        for name, probe in probes:
            try:
                section = probe()
            except Exception as exc:  # a probe must never take the report down
                section = Section(name, False, f"probe failed: {type(exc).__name__}: {exc}")
            sections.append(Section(section.name, section.ok, redact(section.summary), _scrub(section.data)))
        return sections

    # --- probes -------------------------------------------------------------------------------

    def version(self) -> Section:
        lock = lockfile.installed(self.venv)
        data = {
            "sparkfold": __version__,
            "commit": __commit_id__,
            "lock": lock.line() if lock else None,
            "python": platform.python_version(),
            "host": socket.gethostname(),
        }
        # The lock's digest: two nodes (or a node and CI) with the same one run the same packages.
        installed_from = f"lock {lock.name} sha256:{lock.sha256[:16]}" if lock else "no lock recorded"
        summary = f"sparkfold {__version__} (commit {__commit_id__ or 'unknown'}) on {data['host']}"
        return Section("version", None, f"{summary}, {installed_from}", data)

    def config_section(self) -> Section:
        if self.config is None:
            return Section("config", None, "no config file given")
        try:
            self.settings = load(self.config)
        except ConfigError as exc:
            problems = exc.problems
            return Section("config", False, f"{self.config}: {problems[0]}", {"problems": problems})
        settings = self.settings
        data = {
            "file": str(self.config),
            "rank": settings.node.rank,
            "engine": settings.engine.kind,
            "tp": settings.engine.tp,
            "engine_fingerprint": engine_fingerprint(settings),
        }
        return Section(
            "config",
            True,
            f"{self.config}: ok, rank {settings.node.rank}, engine {settings.engine.kind}",
            data,
        )

    def _no_settings(self, name: str) -> Section:
        return Section(name, None, "skipped: needs a valid config")

    def fabric(self) -> Section:
        if self.settings is None:
            return self._no_settings("fabric")
        report = discover(self.settings, sysfs=self.sysfs, run=self.run, ping=False)
        lines = [check.line() for check in report.checks]
        summary = "ok (no ping)" if report.ok else "; ".join(c.line() for c in report.failures)
        return Section("fabric", report.ok, summary, {"checks": lines, "facts": report.facts})

    def rdma(self) -> Section:
        root = self.sysfs / "class/infiniband"
        if not root.is_dir():
            return Section("rdma", None, "no RDMA devices on this node")
        devices: dict[str, Any] = {}
        for hca in sorted(root.iterdir()):
            ports: dict[str, Any] = {}
            for port in sorted((hca / "ports").iterdir()) if (hca / "ports").is_dir() else []:
                gids = {}
                for entry in sorted((port / "gids").iterdir()) if (port / "gids").is_dir() else []:
                    gid, kind = _read(entry), _read(port / "gid_attrs/types" / entry.name)
                    if gid and gid.strip("0:") and kind:
                        gids[entry.name] = f"{gid} {kind}"
                ports[port.name] = {"state": _read(port / "state"), "gids": gids}
            devices[hca.name] = ports
        return Section("rdma", True, f"{len(devices)} device(s): {', '.join(devices)}", {"devices": devices})

    def netdevs(self) -> Section:
        result = self.run(["ip", "-j", "link", "show"])
        if result.returncode != 0:
            return Section("netdevs", False, f"ip link show: {_failed(result)}")
        links = [
            {"name": link.get("ifname"), "mtu": link.get("mtu"), "state": link.get("operstate")}
            for link in json.loads(result.stdout)
        ]
        shown = ", ".join(f"{ln['name']} {ln['mtu']} {ln['state']}" for ln in links if ln["name"] != "lo")
        return Section("netdevs", True, shown or "no netdevs", {"links": links})

    def firewall(self) -> Section:
        """Whether the node's packet filter lets in the gateway's clients (head), everything from the
        peer, and the engine port on loopback (rank 0): an active ufw that filters is judged from
        its own table (node/ufw.py), otherwise the nftables ruleset, or iptables-save where there is
        no nft or nft's listing does not decide (node/packetfilter.py)."""
        if self.settings is None:
            return self._no_settings("firewall")
        settings = self.settings
        public = settings.node.rank == 0 and not is_loopback(settings.api.host)
        gateway_port = settings.api.port if public else None
        peer = None if settings.fabric.peer is None else str(settings.fabric.peer)
        ufw = self.run(["ufw", "status", "verbose"])
        said = "no ufw"
        if ufw.returncode == 0:
            verdict = judge(ufw.stdout, peer=peer, gateway_port=gateway_port)
            if verdict.ok is not None:
                return Section("firewall", verdict.ok, verdict.line, {"blocked": list(verdict.blocked)})
            said = verdict.line
        elif ufw.returncode != 127:
            said = f"ufw status: {_failed(ufw)}"
        needs = needs_for(
            peer=peer,
            gateway_port=gateway_port,
            engine_port=settings.engine.port if settings.node.rank == 0 else None,
            link_netdev=settings.fabric.socket_ifname,
        )
        filtered = self._packet_filter(needs)
        if filtered is None:
            return Section("firewall", None, f"{said}; no nft or iptables on this node")
        if isinstance(filtered, str):
            return Section("firewall", None, f"{said}; {filtered}")
        return Section(
            "firewall", filtered.ok, f"{said}; {filtered.line}", {"blocked": list(filtered.blocked)}
        )

    def _packet_filter(self, needs: list[Need]) -> FirewallVerdict | str | None:
        """The verdict of nftables' ruleset (iptables' where there is no nft), the failure in words,
        or None where neither tool is there. Where nft's listing holds rules it cannot read (the
        ``xt`` matches iptables-nft writes, e.g. conntrack) or no input filter at all (legacy
        iptables' rules are not in it) and iptables-save judges, that wins."""
        verdict = self._judge_listing(["nft", "-j", "list", "ruleset"], needs)
        if verdict is None:
            return self._judge_listing(["iptables-save"], needs)
        if isinstance(verdict, FirewallVerdict) and verdict.ok is None:
            legacy = self._judge_listing(["iptables-save"], needs)
            if isinstance(legacy, FirewallVerdict) and legacy.ok is not None:
                return legacy
        return verdict

    def _judge_listing(self, argv: list[str], needs: list[Need]) -> FirewallVerdict | str | None:
        result = self.run(argv)
        if result.returncode == 127:
            return None
        if result.returncode != 0:
            return f"{argv[0]}: {_failed(result)} (run sparkfold doctor with sudo)"
        nft = argv[0] == "nft"
        try:
            chains = parse_nft_json(result.stdout) if nft else parse_iptables_save(result.stdout)
        except ValueError as error:
            return f"{argv[0]}: {error}"
        return judge_rules("nftables" if nft else "iptables", chains, needs)

    def memory(self) -> Section:
        info = {}
        for line in _read(self.proc / "meminfo").splitlines():
            key, _, rest = line.partition(":")
            if key in ("MemTotal", "MemAvailable") and rest.split():
                info[key] = round(int(rest.split()[0]) * 1024 / GIB, 1)
        if "MemAvailable" not in info:
            return Section("memory", False, f"cannot read {self.proc / 'meminfo'}")
        data: dict[str, Any] = {"total_gib": info.get("MemTotal"), "available_gib": info["MemAvailable"]}
        summary = f"{data['available_gib']} GiB available of {data['total_gib']}"
        if self.settings is None:
            return Section("memory", True, summary, data)
        plan = budget(self.settings, self.proc.parent)
        kills = read_kills(kills_path(self.settings))
        data["budget"] = plan.to_dict()
        data["guard_kills"] = len(kills)
        summary += f"; budget: {plan.sum_text()}"
        if kills:
            data["last_kill"] = kill_line(kills[-1], plan)
            summary += f"; the memory guard killed the engine {len(kills)} time(s): {data['last_kill']}"
        return Section("memory", not kills and (plan.fits or bool(plan.unknown)), summary, data)

    def gpu(self) -> Section:
        query = "name,driver_version,memory.used,memory.total"
        result = self.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"])
        if result.returncode != 0:
            return Section(
                "gpu", None if result.returncode == 127 else False, f"nvidia-smi: {_failed(result)}"
            )
        gpus = [line.strip() for line in result.stdout.splitlines() if line.strip()]
        return Section("gpu", True, "; ".join(gpus) or "no GPU listed", {"gpus": gpus})

    def docker(self) -> Section:
        result = self.run(["docker", "version", "--format", "{{.Server.Version}}"])
        if result.returncode != 0:
            return Section(
                "docker", None if result.returncode == 127 else False, f"docker: {_failed(result)}"
            )
        data: dict[str, Any] = {"server": result.stdout.strip()}
        if self.settings is None or self.settings.engine.kind != "tensorfold":
            return Section("docker", True, f"server {data['server']} (no engine image for this engine)", data)
        from sparkfold.engines.tensorfold.launch import image_label_argv

        image = self.settings.engine.tensorfold.image
        label = self.run(image_label_argv(self.settings))
        data.update(image=image, label=label.stdout.strip() if label.returncode == 0 else None)
        if label.returncode != 0:
            return Section("docker", False, f"server {data['server']}; image {image}: {_failed(label)}", data)
        return Section("docker", True, f"server {data['server']}; image {image} label {data['label']}", data)

    def weights(self) -> Section:
        if self.settings is None:
            return self._no_settings("weights")
        from sparkfold.weights import WeightsError, default_manifest_path, read_manifest, verify_dir

        model = Path(self.settings.engine.model)
        manifest = default_manifest_path(model)
        if not manifest.is_file():
            return Section("weights", None, f"no manifest at {manifest}", {"dir": str(model)})
        try:
            report = verify_dir(model, read_manifest(manifest), sizes_only=True)
        except (WeightsError, OSError) as exc:
            return Section("weights", False, str(exc), {"dir": str(model)})
        data = report.to_json()
        return Section("weights", report.ok, report.message(), data)

    def units(self) -> Section:
        states: dict[str, Any] = {}
        for unit in UNITS:
            active = self.run(["systemctl", "is-active", unit])
            if active.returncode == 127:
                return Section("units", None, f"systemctl: {_failed(active)}")
            pid = self.run(["systemctl", "show", "-p", "MainPID", "--value", unit])
            states[unit] = {
                "active": active.stdout.strip() or "unknown",
                "main_pid": pid.stdout.strip() if pid.returncode == 0 else None,
            }
        summary = ", ".join(f"{unit} {state['active']}" for unit, state in states.items())
        return Section("units", None, summary, {"units": states})

    def errors(self) -> Section:
        argv = ["journalctl", "-p", "err", "-n", str(JOURNAL_LINES), "--no-pager", "-o", "short-iso"]
        for unit in UNITS:
            argv += ["-u", unit]
        result = self.run(argv)
        if result.returncode != 0:
            return Section(
                "errors", None if result.returncode == 127 else False, f"journalctl: {_failed(result)}"
            )
        lines = [line for line in result.stdout.splitlines() if line and not line.startswith("-- ")]
        return Section("errors", not lines, f"{len(lines)} recent error line(s)", {"lines": lines})


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8").strip()
    except OSError:
        return ""


def as_dict(sections: list[Section]) -> dict[str, Any]:
    """The ``--json`` shape: ``{"sections": {name: {ok, summary, data}}}``."""
    return {"sections": {s.name: {k: v for k, v in asdict(s).items() if k != "name"} for s in sections}}


def as_table(sections: list[Section]) -> str:
    """The readable shape: one row per section (status, name, summary)."""
    marks = {True: "ok", False: "FAIL", None: "-"}
    width = max(len(s.name) for s in sections)
    return "\n".join(f"{marks[s.ok]:<4} {s.name:<{width}}  {s.summary}" for s in sections) + "\n"
