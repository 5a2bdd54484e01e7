"""The sparkfold_image role on this host against a fake ``docker``: build once, re-run changes
nothing, a failed build names the patch and leaves the previous image, a check run builds nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

BIN = Path(sys.executable).parent
IMAGE = "sparkfold-tensorfold:v0.6.0"


@pytest.fixture
def pair(tmp_path: Path) -> Path:
    """A one-node inventory (the head, local connection, tp 1) with its own cache folder."""
    inventory = {
        "sparkfold_nodes": {
            "children": {
                "sparkfold_head": {
                    "hosts": {
                        "h1": {
                            "ansible_connection": "local",
                            "ansible_python_interpreter": sys.executable,
                            "sparkfold_fabric_address": "203.0.113.1",
                        }
                    }
                },
                "sparkfold_worker": {"hosts": {}},
            },
            "vars": {
                "sparkfold_engine": "tensorfold",
                "sparkfold_engine_tp": 1,
                "sparkfold_cache_dir": str(tmp_path / "cache"),
                "sparkfold_image_tensorfold_commit": "0123456789abcdef0123456789abcdef01234567",
            },
        }
    }
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    (tmp_path / "docker").mkdir()
    return tmp_path


def play(repo: Path, pair: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {
        **os.environ,
        "ANSIBLE_CONFIG": str(repo / "ansible.cfg"),
        "ANSIBLE_NOCOLOR": "1",
        "PATH": f"{repo / 'tests/ansible/fakes'}:{BIN}:{os.environ['PATH']}",
        "FAKE_DOCKER_DIR": str(pair / "docker"),
        **env,
    }
    argv = [str(BIN / "ansible-playbook"), "-i", str(pair / "hosts.yml"), "playbooks/image.yml", *args]
    return subprocess.run(
        argv, cwd=repo, env=environ, capture_output=True, text=True, timeout=300, check=False
    )


def label(pair: Path) -> str | None:
    image = pair / "docker" / f"image-{IMAGE.replace(':', '_')}"
    return image.read_text().strip() if image.exists() else None


def recap(result: subprocess.CompletedProcess[str]) -> str:
    return next(line for line in result.stdout.splitlines() if line.startswith("h1 ") and "ok=" in line)


@pytest.mark.slow
def test_build_once_then_converge(repo: Path, pair: Path) -> None:
    check = play(repo, pair, "--check")
    assert check.returncode == 0, check.stdout + check.stderr
    assert label(pair) is None, "a check run builds nothing"

    first = play(repo, pair)
    assert first.returncode == 0, first.stdout + first.stderr
    built = label(pair)
    assert built is not None and len(built) == 64
    assert f"must carry org.sparkfold.tensorfold.series={built}" in first.stdout
    assert "try-restart sparkfold-engine.service" in (pair / "docker/calls").read_text()

    again = play(repo, pair)
    assert again.returncode == 0 and "changed=0" in recap(again), again.stdout
    assert f"{IMAGE} on h1: current" in again.stdout


@pytest.mark.slow
def test_failed_build_names_the_patch_and_keeps_the_previous_image(repo: Path, pair: Path) -> None:
    assert play(repo, pair).returncode == 0
    before = label(pair)
    failed = play(repo, pair, "-e", '{"sparkfold_image_extras": ["av==18.1.0"]}', FAKE_BUILD_FAIL="1")
    assert failed.returncode != 0
    assert "previous image (if any) is unchanged" in failed.stdout
    assert "patch 0007-window.patch does not apply" in failed.stdout
    assert label(pair) == before
    assert not (pair / "docker" / f"image-{IMAGE.replace(':', '_')}-building").exists()


@pytest.mark.slow
def test_an_unpinned_commit_stops_the_build_in_words(repo: Path, pair: Path) -> None:
    failed = play(repo, pair, "-e", "sparkfold_image_tensorfold_commit=''")
    assert failed.returncode != 0
    assert "set it to the 40-hex commit of v0.6.0" in failed.stdout
    assert label(pair) is None
