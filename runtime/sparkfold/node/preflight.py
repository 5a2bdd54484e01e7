"""``sparkfold preflight``: can this node run its engine rank?

Checks, in order: the operating system, the CPU architecture, the node's total memory, the
engine's memory budget (:mod:`sparkfold.node.budget`: its footprint from its settings against the
node's usable memory less the reserve), available memory and free disk against thresholds, and
(only where ``engine.kind`` needs them) an NVIDIA GPU and Docker with the NVIDIA container runtime.
Every failure is one :class:`~sparkfold.node.checks.Check` whose ``fix`` says what to do. The same
function runs from the Ansible preflight role and as ``ExecStartPre``.

Thresholds default per engine kind (:data:`DEFAULT_THRESHOLDS`); the production pair needs ~110 GiB
of available memory per node (weights, KV pool and reserve) and room for the checkpoint.

Only what is about to be loaded or written is asked for, so a re-run on a serving pair never
stops on the memory and disk the pair itself uses:

- total memory and the architecture are always checked (a node that can never run fails early);
  the x86_64 testbed alone accepts its architecture for the tensorfold stand-in (``testbed_arch``,
  reported as ``TESTBED OVERRIDE``);
- available memory is checked only when no rank runs here (:mod:`sparkfold.node.marker`): the
  memory a serving rank holds is released when it restarts, and ``ExecStartPre`` checks it then;
- free disk is checked for what is still missing: the threshold less the bytes the weights
  (``engine.model``) and the engine image already occupy, and not at all while a rank serves this
  very engine configuration (its weights and image are in place).
"""

from __future__ import annotations

import json
import platform
import shutil
from dataclasses import dataclass
from pathlib import Path

from sparkfold.config import Settings, engine_fingerprint
from sparkfold.node.budget import Budget, budget
from sparkfold.node.checks import Check, Report, Runner, run_command
from sparkfold.node.marker import Serving, serving
from sparkfold.units import GIB

__all__ = ["DEFAULT_THRESHOLDS", "SUPPORTED_OS", "Thresholds", "preflight"]

SUPPORTED_OS = ("debian", "ubuntu")


@dataclass(frozen=True)
class Thresholds:
    """Least available memory and free disk (under ``paths.state_dir``) a node must have, in GiB."""

    memory_gib: float
    disk_gib: float


DEFAULT_THRESHOLDS: dict[str, Thresholds] = {
    "transformers": Thresholds(memory_gib=1.0, disk_gib=2.0),
    "exllamav3": Thresholds(memory_gib=110.0, disk_gib=180.0),
    "tensorfold": Thresholds(memory_gib=110.0, disk_gib=215.0),  # checkpoint + the engine image
}

_ARCHITECTURES = {
    "transformers": ("x86_64", "aarch64"),
    "exllamav3": ("x86_64", "aarch64"),
    "tensorfold": ("aarch64",),  # DGX Spark (GB10) is arm64
}


def _os_release(root: Path) -> dict[str, str]:
    fields: dict[str, str] = {}
    for name in ("etc/os-release", "usr/lib/os-release"):
        path = root / name
        if path.is_file():
            for line in path.read_text(encoding="utf-8").splitlines():
                key, sep, value = line.partition("=")
                if sep:
                    fields[key.strip()] = value.strip().strip('"')
            break
    return fields


def _check_os(root: Path) -> Check:
    release = _os_release(root)
    if not release:
        return Check(
            "os", False, "no /etc/os-release", "run sparkfold on Debian 12+ or Ubuntu 22.04+ (DGX OS)"
        )
    family = {release.get("ID", "")} | set(release.get("ID_LIKE", "").split())
    name = release.get("PRETTY_NAME", release.get("ID", "unknown"))
    if family & set(SUPPORTED_OS):
        return Check("os", True, name)
    return Check("os", False, f"{name} is not supported", "use Debian 12+ or Ubuntu 22.04+ (DGX OS)")


def _check_arch(kind: str, machine: str, testbed_arch: str | None = None) -> Check:
    allowed = _ARCHITECTURES[kind]
    if machine in allowed:
        return Check("arch", True, machine)
    if testbed_arch == machine:
        return Check(
            "arch",
            True,
            f"TESTBED OVERRIDE: {machine} cannot run the {kind} engine on a real node; accepted only "
            f"because --testbed-arch {machine} is set (sparkfold_preflight_testbed_arch)",
        )
    return Check(
        "arch",
        False,
        f"{machine} cannot run the {kind} engine",
        f"run it on {' or '.join(allowed)}, or pick another engine.kind",
    )


def _meminfo_gib(root: Path, field: str) -> float | None:
    path = root / "proc/meminfo"
    if not path.is_file():
        return None
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024 / GIB
    return None


def _check_memory_total(root: Path, need: float) -> Check:
    have = _meminfo_gib(root, "MemTotal")
    if have is None:
        return Check("memory_total", False, "MemTotal not found in /proc/meminfo", "run on Linux")
    return Check.measured(
        "memory_total",
        have >= need,
        f"{have:.1f} GiB in all (need {need:g})",
        f"this node has {have:.1f} GiB of memory in all; the engine needs {need:g} available",
        "run the engine on a node with more memory (a DGX Spark has 128 GB), or lower engine.context",
    )


def _check_budget(plan: Budget) -> Check:
    if plan.unknown:
        return Check(
            "memory_budget",
            True,
            f"{plan.unknown}: summed at the engine's start (ExecStartPre); so far {plan.sum_text()}",
            skipped=True,
        )
    return Check.measured(
        "memory_budget",
        plan.fits,
        f"{plan.sum_text()}; {plan.headroom_gib:.1f} GiB to spare",
        f"the engine does not fit this node: {plan.sum_text()}, {-plan.headroom_gib:.1f} GiB over",
        plan.advice(),
    )


def _check_memory(root: Path, need: float, running: Serving | None, fingerprint: str) -> Check:
    if running is not None:
        what = "this engine configuration" if running.fingerprint == fingerprint else "another configuration"
        return Check(
            "memory",
            True,
            f"rank {running.rank} (pid {running.pid}) serves {what} and holds its memory; "
            "available memory is checked at the engine's next start (ExecStartPre), once released",
            skipped=True,
        )
    have = _meminfo_gib(root, "MemAvailable")
    if have is None:
        return Check("memory", False, "MemAvailable not found in /proc/meminfo", "run on Linux 3.14 or later")
    return Check.measured(
        "memory",
        have >= need,
        f"{have:.1f} GiB available (need {need:g})",
        f"only {have:.1f} GiB memory available (need {need:g})",
        "stop other workloads on this node (docker ps, nvidia-smi), or lower engine.context",
    )


def _existing_parent(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _tree_bytes(path: Path) -> int:
    """Bytes of the regular files under ``path`` (a file or a folder; 0 when absent)."""
    if path.is_file():
        return path.stat().st_size
    if not path.is_dir():
        return 0
    return sum(
        entry.stat().st_size for entry in path.rglob("*") if entry.is_file() and not entry.is_symlink()
    )


def _image_bytes(settings: Settings, run: Runner) -> int:
    """Size of the engine image when it is already here (docker launcher), else 0."""
    tensorfold = settings.engine.tensorfold
    if settings.engine.kind != "tensorfold" or tensorfold.launcher != "docker":
        return 0
    result = run(["docker", "image", "inspect", "--format", "{{.Size}}", tensorfold.image])
    text = result.stdout.strip()
    return int(text) if result.returncode == 0 and text.isdigit() else 0


def _check_disk(settings: Settings, need: float, running: Serving | None, run: Runner) -> Check:
    where = _existing_parent(settings.paths.state_dir)
    have = shutil.disk_usage(where).free / GIB
    if running is not None and running.fingerprint == engine_fingerprint(settings):
        return Check(
            "disk",
            True,
            f"{have:.1f} GiB free under {where}; nothing to write: rank {running.rank} serves this "
            "engine configuration (its weights and image are in place)",
            skipped=True,
        )
    present = (_tree_bytes(Path(settings.engine.model)) + _image_bytes(settings, run)) / GIB
    missing = max(0.0, need - present)
    held = f", {present:.1f} GiB of it already here (weights, image)" if present else ""
    wanted = f"under {where} (need {missing:.1f} more of {need:g}{held})"
    return Check.measured(
        "disk",
        have >= missing,
        f"{have:.1f} GiB free {wanted}",
        f"only {have:.1f} GiB free {wanted}",
        "free space there, or point paths.state_dir at a larger disk",
    )


def _check_gpu(run: Runner) -> Check:
    result = run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"])
    if result.returncode == 127:
        return Check("gpu", False, "nvidia-smi not found", "install the NVIDIA driver (DGX OS ships it)")
    if result.returncode != 0 or not result.stdout.strip():
        reason = (result.stderr or result.stdout).strip().splitlines()
        return Check(
            "gpu",
            False,
            f"nvidia-smi sees no GPU ({reason[0] if reason else 'exit ' + str(result.returncode)})",
            "check the driver: nvidia-smi must list the GPU; reboot after a driver upgrade",
        )
    return Check("gpu", True, "; ".join(result.stdout.strip().splitlines()))


def _check_docker(run: Runner, *, nvidia: bool = True) -> Check:
    result = run(["docker", "info", "--format", "{{json .Runtimes}}"])
    if result.returncode == 127:
        return Check(
            "docker", False, "docker not found", "install Docker Engine and the NVIDIA Container Toolkit"
        )
    if result.returncode != 0:
        return Check(
            "docker",
            False,
            "docker info failed: " + (result.stderr.strip().splitlines() or ["no output"])[0],
            "start the Docker daemon (systemctl start docker) and check this user may use it",
        )
    if not nvidia:
        return Check("docker", True, "Docker answers (engine.tensorfold.gpus is false: no NVIDIA runtime)")
    try:
        runtimes = json.loads(result.stdout or "{}")
    except json.JSONDecodeError:
        runtimes = {}
    if "nvidia" not in runtimes:
        return Check(
            "docker",
            False,
            "Docker has no nvidia runtime",
            "install the NVIDIA Container Toolkit, then nvidia-ctk runtime configure --runtime=docker",
        )
    return Check("docker", True, "Docker with the nvidia runtime")


def preflight(
    settings: Settings,
    thresholds: Thresholds | None = None,
    *,
    root: Path = Path("/"),
    machine: str | None = None,
    run: Runner = run_command,
    testbed_arch: str | None = None,
) -> Report:
    """Check this node for ``settings``; ``root``, ``machine`` and ``run`` let tests swap the host.

    ``testbed_arch`` accepts that one architecture for any engine kind (the x86_64 testbed running
    the tensorfold stand-in); the check then passes with a detail that starts ``TESTBED OVERRIDE``.
    """
    kind = settings.engine.kind
    limits = thresholds or DEFAULT_THRESHOLDS[kind]
    running = serving(root)
    report = Report(
        facts={
            "engine_kind": kind,
            "memory_gib": limits.memory_gib,
            "disk_gib": limits.disk_gib,
            "serving": None if running is None else running.fingerprint == engine_fingerprint(settings),
        }
    )
    report.add(_check_os(root))
    report.add(_check_arch(kind, machine or platform.machine(), testbed_arch))
    report.add(_check_memory_total(root, limits.memory_gib))
    plan = budget(settings, root)
    report.facts["budget"] = plan.to_dict()
    report.add(_check_budget(plan))
    report.add(_check_memory(root, limits.memory_gib, running, engine_fingerprint(settings)))
    report.add(_check_disk(settings, limits.disk_gib, running, run))
    gpus = kind == "exllamav3" or (kind == "tensorfold" and settings.engine.tensorfold.gpus)
    if gpus:
        report.add(_check_gpu(run))
    elif kind == "tensorfold":
        report.add(Check("gpu", True, "engine.tensorfold.gpus is false: the rank gets no GPU", skipped=True))
    else:
        report.add(Check("gpu", True, f"not needed by the {kind} engine", skipped=True))
    if kind == "tensorfold":
        report.add(_check_docker(run, nvidia=settings.engine.tensorfold.gpus))
    else:
        report.add(Check("docker", True, f"not needed by the {kind} engine", skipped=True))
    return report
