"""The runtime role refuses, in words and before building anything, a node whose Python platform
differs from the control host's: the wheelhouse's binary wheels would not install there."""

from __future__ import annotations

from pathlib import Path

from local_head import ansible, write_inventory


def test_a_node_of_another_platform_stops_before_the_wheelhouse(repo: Path, tmp_path: Path) -> None:
    other = tmp_path / "python3"  # a node interpreter that reports an aarch64 CPython 3.12
    other.write_text("#!/bin/sh\necho 'linux-aarch64 cp312'\n")
    other.chmod(0o755)
    hosts = write_inventory(tmp_path, sparkfold_runtime_python=str(other))
    result = ansible(repo, "ansible-playbook", "-i", str(hosts), "playbooks/runtime.yml")
    assert result.returncode != 0, result.stdout
    said = " ".join(result.stdout.split())
    assert "h1 runs linux-aarch64 cp312, but the control host builds the wheelhouse with linux-" in said
    assert "Run ansible-playbook from a host of the nodes' platform" in said
    assert not (tmp_path / "control" / "wheelhouse").exists()  # stopped before building anything
