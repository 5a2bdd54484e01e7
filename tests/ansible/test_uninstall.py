"""``playbooks/uninstall.yml`` on this host: a head installed under a temporary folder (units, venv,
settings, caches, state with weights), fake ``systemctl`` and ``docker``; the weights stay unless asked,
and a second run changes nothing."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from local_head import ansible, fake_tools, write_inventory

UNITS = ("sparkfold-api.service", "sparkfold-engine.service")


@pytest.fixture
def head(tmp_path: Path) -> Path:
    for folder in ("units", "install/venv/bin", "etc", "cache/tensorfold", "state/models/GLM", "calls"):
        (tmp_path / folder).mkdir(parents=True)
    for unit in UNITS:
        (tmp_path / "units" / unit).write_text("[Service]\nExecStart=/bin/true\n")
    (tmp_path / "etc/sparkfold.toml").write_text("[engine]\n")
    (tmp_path / "etc/api-keys").write_text("sha256:" + "0" * 64 + "\n")
    (tmp_path / "state/models/GLM/model.safetensors").write_bytes(b"weights")
    (tmp_path / "state/engine.sha256").write_text("x\n")
    (tmp_path / "calls/image-sparkfold-tensorfold_v0.6.0").write_text("label\n")  # the fake docker's image
    write_inventory(
        tmp_path,
        sparkfold_user="sftest-nosuchuser",  # never an account of this host
        sparkfold_install_dir=str(tmp_path / "install"),
        sparkfold_config_dir=str(tmp_path / "etc"),
        sparkfold_cache_dir=str(tmp_path / "cache"),
        sparkfold_state_dir=str(tmp_path / "state"),
    )
    return tmp_path


def uninstall(repo: Path, head: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    args = [
        "-i",
        str(head / "hosts.yml"),
        "playbooks/uninstall.yml",
        "-e",
        f"_sparkfold_uninstall_unit_dir={head / 'units'}",
    ]
    for value in extra:
        args += ["-e", value]
    return ansible(repo, "ansible-playbook", *args, env=fake_tools(repo, head / "calls"))


def recap(result: subprocess.CompletedProcess[str]) -> dict[str, int]:
    line = next(line for line in result.stdout.splitlines() if line.startswith("h1 ") and "ok=" in line)
    return {key: int(value) for key, value in re.findall(r"(\w+)=(\d+)", line)}


@pytest.mark.slow
def test_uninstall_removes_units_runtime_and_settings_and_keeps_the_weights(repo: Path, head: Path) -> None:
    result = uninstall(repo, head)
    assert result.returncode == 0, result.stdout + result.stderr
    calls = (head / "calls/calls").read_text().splitlines()
    assert calls[:2] == [f"disable --now {unit}" for unit in UNITS]  # the gateway first
    assert "daemon-reload" in calls
    assert not any((head / "units" / unit).exists() for unit in UNITS)
    for gone in ("install", "etc", "cache", "state/engine.sha256"):
        assert not (head / gone).exists(), gone
    assert (head / "state/models/GLM/model.safetensors").read_bytes() == b"weights"
    assert (head / "calls/image-sparkfold-tensorfold_v0.6.0").exists()  # images stay unless asked
    again = uninstall(repo, head)
    assert again.returncode == 0 and recap(again)["changed"] == 0, again.stdout


def test_weights_and_images_go_only_when_asked(repo: Path, head: Path) -> None:
    result = uninstall(
        repo, head, "sparkfold_uninstall_weights_enabled=true", "sparkfold_uninstall_images_enabled=true"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert not (head / "state").exists()
    assert not (head / "calls/image-sparkfold-tensorfold_v0.6.0").exists()
    assert "image rm sparkfold-tensorfold:v0.6.0-previous" in (head / "calls/calls").read_text()
