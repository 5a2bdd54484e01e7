"""``sparkfold.node.preflight`` against a fake root (os-release, meminfo) and fake commands."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from node_fakes import FakeHost, settings

from sparkfold.cli import main
from sparkfold.node.preflight import Thresholds, preflight

DEBIAN = 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nID=debian\n'


def fake_root(tmp_path: Path, os_release: str = DEBIAN, available_kib: int = 64 * 1024 * 1024) -> Path:
    (tmp_path / "etc").mkdir()
    (tmp_path / "proc").mkdir()
    (tmp_path / "etc/os-release").write_text(os_release)
    (tmp_path / "proc/meminfo").write_text(f"MemTotal: 1 kB\nMemAvailable: {available_kib} kB\n")
    return tmp_path


def by_name(report_checks: list, name: str):  # type: ignore[no-untyped-def]
    return next(check for check in report_checks if check.name == name)


def test_transformers_node_passes_and_skips_gpu_and_docker(tmp_path: Path, host: FakeHost) -> None:
    s = settings(paths={"state_dir": str(tmp_path)})
    report = preflight(s, root=fake_root(tmp_path), machine="x86_64", run=host)
    assert report.ok, report.to_dict()
    assert by_name(report.checks, "gpu").skipped and by_name(report.checks, "docker").skipped
    assert host.calls == []  # no GPU or Docker probe for the CPU engine


def test_low_memory_says_what_to_do(tmp_path: Path, host: FakeHost) -> None:
    s = settings(paths={"state_dir": str(tmp_path)})
    report = preflight(s, Thresholds(8, 0), root=fake_root(tmp_path, available_kib=2 * 1024 * 1024), run=host)
    memory = by_name(report.checks, "memory")
    assert not report.ok and not memory.ok
    assert "only 2.0 GiB memory available (need 8)" in memory.detail
    assert "stop other workloads" in memory.fix


def test_disk_threshold_checks_the_nearest_existing_parent(tmp_path: Path, host: FakeHost) -> None:
    s = settings(paths={"state_dir": str(tmp_path / "not/yet/there")})
    report = preflight(s, Thresholds(0, 1e9), root=fake_root(tmp_path), run=host)
    disk = by_name(report.checks, "disk")
    assert not disk.ok and f"free under {tmp_path} " in disk.detail and "paths.state_dir" in disk.fix


def test_unsupported_os_and_arch(tmp_path: Path, host: FakeHost) -> None:
    root = fake_root(tmp_path, os_release='PRETTY_NAME="Plan 9"\nID=plan9\n')
    report = preflight(settings(engine={"kind": "tensorfold"}), root=root, machine="x86_64", run=host)
    assert [c.name for c in report.failures][:2] == ["os", "arch"]
    assert "x86_64 cannot run the tensorfold engine" in by_name(report.checks, "arch").detail


def test_ubuntu_derivative_is_accepted(tmp_path: Path, host: FakeHost) -> None:
    root = fake_root(tmp_path, os_release='PRETTY_NAME="DGX OS 7"\nID=dgx\nID_LIKE="ubuntu debian"\n')
    assert by_name(preflight(settings(), root=root, run=host).checks, "os").ok


@pytest.mark.parametrize(
    ("nvidia_rc", "runtimes", "failing", "fix"),
    [
        (127, {"nvidia": {}}, "gpu", "install the NVIDIA driver"),
        (0, {"runc": {}}, "docker", "nvidia-ctk runtime configure"),
    ],
)
def test_tensorfold_needs_gpu_and_nvidia_runtime(
    tmp_path: Path, host: FakeHost, nvidia_rc: int, runtimes: dict, failing: str, fix: str
) -> None:
    host.answer(["nvidia-smi"], nvidia_rc, "NVIDIA GB10, 128 GiB\n" if nvidia_rc == 0 else "")
    host.answer(["docker", "info"], 0, runtimes)
    s = settings(engine={"kind": "tensorfold"}, paths={"state_dir": str(tmp_path)})
    report = preflight(s, Thresholds(0, 0), root=fake_root(tmp_path), machine="aarch64", run=host)
    assert [c.name for c in report.failures] == [failing]
    assert fix in report.failures[0].fix


def test_tensorfold_node_with_everything_passes(tmp_path: Path, host: FakeHost) -> None:
    host.answer(["nvidia-smi"], 0, "NVIDIA GB10, 128 GiB\n")
    host.answer(["docker", "info"], 0, {"nvidia": {}, "runc": {}})
    s = settings(engine={"kind": "tensorfold"}, paths={"state_dir": str(tmp_path)})
    report = preflight(s, Thresholds(0, 0), root=fake_root(tmp_path), machine="aarch64", run=host)
    assert report.ok, report.to_dict()


def test_command_json_and_exit_code(tmp_path: Path) -> None:
    config = tmp_path / "node.toml"
    config.write_text(f'[engine]\nmodel = "/m"\n[paths]\nstate_dir = "{tmp_path}"\n')
    ok = CliRunner().invoke(main, ["preflight", "--config", str(config), "--json"])
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.output)["ok"] is True
    failed = CliRunner().invoke(main, ["preflight", "--config", str(config), "--min-disk-gib", "1e12"])
    assert failed.exit_code == 1
    assert "FAIL disk: only" in failed.output and "Error: preflight failed: disk" in failed.output
