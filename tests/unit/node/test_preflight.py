"""``sparkfold.node.preflight`` against a fake root (os-release, meminfo) and fake commands."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from node_fakes import FakeHost, settings

from sparkfold.cli import main
from sparkfold.config import Settings
from sparkfold.node.marker import MARKER, RUN_DIR, mark_serving
from sparkfold.node.preflight import Thresholds, preflight

DEBIAN = 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nID=debian\n'


def fake_root(
    tmp_path: Path,
    os_release: str = DEBIAN,
    available_kib: int = 64 * 1024 * 1024,
    total_kib: int = 125 * 1024 * 1024,  # what a DGX Spark's /proc/meminfo shows (128 GB)
) -> Path:
    (tmp_path / "etc").mkdir()
    (tmp_path / "proc").mkdir()
    (tmp_path / "etc/os-release").write_text(os_release)
    (tmp_path / "proc/meminfo").write_text(f"MemTotal: {total_kib} kB\nMemAvailable: {available_kib} kB\n")
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


def test_the_testbed_stand_in_needs_docker_but_no_gpu_and_its_arch_is_overridden_loudly(
    tmp_path: Path, host: FakeHost
) -> None:
    host.answer(["docker", "info"], 0, {"runc": {}})
    tensorfold = {"kind": "tensorfold", "tensorfold": {"gpus": False, "rdma": False}}
    s = settings(engine=tensorfold, paths={"state_dir": str(tmp_path)})
    root = fake_root(tmp_path)
    refused = preflight(s, Thresholds(0, 0), root=root, machine="x86_64", run=host)
    assert [c.name for c in refused.failures] == ["arch"]
    report = preflight(s, Thresholds(0, 0), root=root, machine="x86_64", run=host, testbed_arch="x86_64")
    assert report.ok, report.to_dict()
    assert by_name(report.checks, "arch").detail.startswith("TESTBED OVERRIDE: x86_64 cannot run")
    assert by_name(report.checks, "gpu").skipped and "gpus is false" in by_name(report.checks, "gpu").detail
    assert {call[0] for call in host.calls} == {"docker"}  # no nvidia-smi
    # The override names one architecture: it is no blanket pass.
    other = preflight(s, Thresholds(0, 0), root=root, machine="riscv64", run=host, testbed_arch="x86_64")
    assert [c.name for c in other.failures] == ["arch"]


def test_command_json_and_exit_code(tmp_path: Path) -> None:
    config = tmp_path / "node.toml"
    config.write_text(f'[engine]\nmodel = "/m"\n[paths]\nstate_dir = "{tmp_path}"\n')
    ok = CliRunner().invoke(main, ["preflight", "--config", str(config), "--json"])
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.output)["ok"] is True
    failed = CliRunner().invoke(main, ["preflight", "--config", str(config), "--min-disk-gib", "1e12"])
    assert failed.exit_code == 1
    assert "FAIL disk: only" in failed.output and "Error: preflight failed: disk" in failed.output


# --- A serving pair: preflight asks only for what is about to be loaded or written -------------------

GIB_KIB = 1024 * 1024


def serving_spark(tmp_path: Path, host: FakeHost, weights_gib: float) -> tuple[Path, Path]:
    """A Spark as a serving rank leaves it: 8 GiB available of 125, and the weights on disk (sparse)."""
    root = fake_root(tmp_path, available_kib=8 * GIB_KIB)
    model = tmp_path / "state/models/GLM"
    model.mkdir(parents=True)
    for index, size in enumerate((weights_gib / 2, weights_gib / 2)):
        with (model / f"model-{index:05d}.safetensors").open("wb") as shard:
            shard.truncate(int(size * 1024**3))  # sparse: the size a real shard has, no real disk
    host.answer(["nvidia-smi"], 0, "NVIDIA GB10, 128 GiB\n")
    host.answer(["docker", "info"], 0, {"nvidia": {}, "runc": {}})
    host.answer(["docker", "image", "inspect"], 0, f"{23 * 1024**3}\n")  # the engine image, present
    return root, model


def tensorfold_settings(tmp_path: Path, model: Path, **engine: object) -> Settings:
    """A Spark pair's rank: the weights split over two ranks, FP8 KV (inside the memory budget)."""
    return settings(
        engine={"kind": "tensorfold", "model": str(model), "tp": 2, "tensorfold": {"kv": "fp8"}, **engine},
        fabric={"address": "198.51.100.1", "peer": "198.51.100.2"},
        paths={"state_dir": str(tmp_path / "state")},
    )


def mark(root: Path, s: Settings, pid: int = 4242) -> None:
    """The marker a READY rank leaves in its RuntimeDirectory, and its process."""
    (root / "proc" / str(pid)).mkdir()
    folder = root / RUN_DIR
    folder.mkdir(parents=True)
    assert mark_serving(s, env={"RUNTIME_DIRECTORY": str(folder)}) == folder / MARKER
    record = json.loads((folder / MARKER).read_text())
    assert isinstance(record["load_s"], float) and record["load_s"] >= 0  # this process's age: its load
    (folder / MARKER).write_text(json.dumps({**record, "pid": pid}))


def free_gib(path: Path) -> float:
    return shutil.disk_usage(path).free / 1024**3


def test_a_rerun_on_a_serving_rank_passes_with_the_memory_and_disk_it_uses(
    tmp_path: Path, host: FakeHost
) -> None:
    root, model = serving_spark(tmp_path, host, weights_gib=164)
    s = tensorfold_settings(tmp_path, model)
    mark(root, s)
    # The disk is "full" for a fresh install: the threshold is beyond what is free.
    limits = Thresholds(memory_gib=110, disk_gib=free_gib(tmp_path) + 150)
    report = preflight(s, limits, root=root, machine="aarch64", run=host)
    assert report.ok, report.to_dict()
    memory, disk = by_name(report.checks, "memory"), by_name(report.checks, "disk")
    assert memory.skipped and "serves this engine configuration" in memory.detail
    assert disk.skipped and "nothing to write" in disk.detail
    assert by_name(report.checks, "memory_total").ok and not by_name(report.checks, "memory_total").skipped
    assert report.facts["serving"] is True


def test_a_changed_config_on_a_serving_rank_defers_memory_and_counts_the_weights_on_disk(
    tmp_path: Path, host: FakeHost
) -> None:
    root, model = serving_spark(tmp_path, host, weights_gib=164)
    mark(root, tensorfold_settings(tmp_path, model))
    changed = tensorfold_settings(tmp_path, model, context=262144)  # another fingerprint
    limits = Thresholds(memory_gib=110, disk_gib=free_gib(tmp_path) + 150)
    report = preflight(changed, limits, root=root, machine="aarch64", run=host)
    assert report.ok, report.to_dict()
    memory, disk = by_name(report.checks, "memory"), by_name(report.checks, "disk")
    assert memory.skipped and "another configuration" in memory.detail and "ExecStartPre" in memory.detail
    assert not disk.skipped and "187.0 GiB of it already here" in disk.detail  # 164 weights + 23 image
    assert report.facts["serving"] is False


def test_execstartpre_does_not_demand_the_space_the_weights_use(tmp_path: Path, host: FakeHost) -> None:
    # The unit is starting: no rank runs (its RuntimeDirectory is gone), memory is back, weights stay.
    root, model = serving_spark(tmp_path, host, weights_gib=164)
    (root / "proc/meminfo").write_text(f"MemTotal: {125 * GIB_KIB} kB\nMemAvailable: {115 * GIB_KIB} kB\n")
    s = tensorfold_settings(tmp_path, model)
    report = preflight(s, Thresholds(110, free_gib(tmp_path) + 150), root=root, machine="aarch64", run=host)
    assert report.ok, report.to_dict()
    assert not by_name(report.checks, "memory").skipped and not by_name(report.checks, "disk").skipped


def test_a_fresh_node_still_needs_the_whole_disk_and_memory(tmp_path: Path, host: FakeHost) -> None:
    root, _ = serving_spark(tmp_path, host, weights_gib=164)
    empty = tmp_path / "state/models/other"  # another model: nothing of it is here yet
    host.answer(["docker", "image", "inspect"], 1, "")
    s = tensorfold_settings(tmp_path, empty)
    report = preflight(s, Thresholds(110, free_gib(tmp_path) + 150), root=root, machine="aarch64", run=host)
    assert {c.name for c in report.failures} == {"memory", "disk"}
    assert "only 8.0 GiB memory available (need 110)" in by_name(report.checks, "memory").detail


def test_a_marker_whose_process_is_gone_is_no_serving_rank(tmp_path: Path, host: FakeHost) -> None:
    root, model = serving_spark(tmp_path, host, weights_gib=1)
    s = tensorfold_settings(tmp_path, model)
    mark(root, s)
    (root / "proc/4242").rmdir()
    report = preflight(s, Thresholds(110, 0), root=root, machine="aarch64", run=host)
    assert [c.name for c in report.failures] == ["memory"]


def test_total_memory_is_always_checked(tmp_path: Path, host: FakeHost) -> None:
    root, model = serving_spark(tmp_path, host, weights_gib=1)
    s = tensorfold_settings(tmp_path, model)
    mark(root, s)
    (root / "proc/meminfo").write_text(f"MemTotal: {64 * GIB_KIB} kB\nMemAvailable: {8 * GIB_KIB} kB\n")
    report = preflight(s, Thresholds(110, 0), root=root, machine="aarch64", run=host)
    [failure] = report.failures
    assert failure.name == "memory_total" and "64.0 GiB of memory in all" in failure.detail


def test_outside_systemd_no_marker_is_written(tmp_path: Path) -> None:
    assert mark_serving(settings(), env={}) is None
