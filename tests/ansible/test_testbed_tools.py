"""A host without debootstrap: `make demo` and the testbed play stop before anything is built, with
the one apt-get line (issue #28; before, the play failed minutes in with `debootstrap: command not
found` inside an Ansible error). Both run in check mode or stop first: nothing is built here."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from local_head import BIN, ansible

SYSTEM_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")


def path_without(tmp_path: Path, *missing: str) -> str:
    """A PATH with every command of the system's PATH but ``missing`` (symlinks in one folder)."""
    shim = tmp_path / "bin"
    shim.mkdir()
    for folder in SYSTEM_PATH:
        for tool in Path(folder).glob("*") if Path(folder).is_dir() else ():
            if tool.name not in missing and not (shim / tool.name).exists():
                (shim / tool.name).symlink_to(tool)
    return f"{BIN}:{shim}"


def test_make_demo_names_the_apt_line_before_the_venv(repo: Path, tmp_path: Path) -> None:
    """`make demo`'s first prerequisite; a fresh host's venv would take minutes before the play."""
    env = {**os.environ, "PATH": path_without(tmp_path, "debootstrap", "dpkg-scanpackages")}
    done = subprocess.run(
        ["make", "testbed-tools"], cwd=repo, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode != 0
    assert "sudo apt-get install -y debootstrap dpkg-dev" in done.stderr, done.stderr
    for target in ("demo", "demo-fleet"):  # its first prerequisite: before `venv`
        [rule] = [
            line for line in (repo / "Makefile").read_text().splitlines() if line.startswith(f"{target}:")
        ]
        assert rule.split()[1] == "testbed-tools", rule


def test_the_testbed_play_stops_first_naming_the_apt_line(repo: Path, tmp_path: Path) -> None:
    built = tmp_path / "testbed"
    done = ansible(
        repo,
        "ansible-playbook",
        "playbooks/testbed.yml",
        "--check",
        "-e",
        f"sparkfold_testbed_dir={built}",
        env={"PATH": path_without(tmp_path, "debootstrap")},
    )
    assert done.returncode != 0
    words = " ".join(done.stdout.split())
    assert (
        "the testbed needs debootstrap on this host (not on PATH): sudo apt-get install -y debootstrap"
        in words
    )
    assert "ok=2 changed=0 unreachable=0 failed=1 skipped=0" in words, "the first tasks, nothing after"
    assert not built.exists()
