"""A host without debootstrap: `make demo` installs it with apt first (as root, saying so), and the
testbed play stops before anything is built, with the one apt-get line (before, the play failed
minutes in with `debootstrap: command not found` inside an Ansible error). apt-get is a fake here, the
play runs in check mode or stops first: nothing is installed or built."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
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


def fake_apt(shim: Path, installs: bool) -> Path:
    """An apt-get in ``shim`` that logs its arguments and, if ``installs``, puts the packages' tools there."""
    log = shim.parent / "apt.log"
    tools = "debootstrap dpkg-scanpackages" if installs else ""
    script = shim / "apt-get"
    script.write_text(
        f'#!/bin/sh\necho "$*" >> {log}\n'
        f'case "$1" in install) for t in {tools}; do\n'
        f'  printf "#!/bin/sh\\n" > {shim}/$t; chmod +x {shim}/$t\ndone;; esac\n'
    )
    script.chmod(0o755)
    return log


def make_tools(repo: Path, tmp_path: Path, installs: bool) -> tuple[subprocess.CompletedProcess[str], Path]:
    env = {**os.environ, "PATH": path_without(tmp_path, "debootstrap", "dpkg-scanpackages", "apt-get")}
    log = fake_apt(tmp_path / "bin", installs)
    done = subprocess.run(
        ["make", "testbed-tools"], cwd=repo, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    return done, log


@pytest.mark.skipif(os.geteuid() != 0, reason="make demo installs with apt only as root")
def test_make_demo_installs_what_is_missing_with_apt_saying_so_first(repo: Path, tmp_path: Path) -> None:
    """`make demo`'s first prerequisite, before the venv (a fresh host's would take minutes)."""
    done, log = make_tools(repo, tmp_path, installs=True)
    assert done.returncode == 0, done.stderr
    said = "installing what the testbed needs on this host: apt-get install -y debootstrap dpkg-dev"
    assert done.stderr.splitlines() == [said]
    assert log.read_text().splitlines() == [
        "update -qq",
        "install -y -qq --no-install-recommends debootstrap dpkg-dev",
    ]
    for target in ("demo", "demo-fleet"):  # its first prerequisite: before `venv`
        [rule] = [
            line for line in (repo / "Makefile").read_text().splitlines() if line.startswith(f"{target}:")
        ]
        assert rule.split()[1] == "testbed-tools", rule


@pytest.mark.skipif(os.geteuid() != 0, reason="make demo installs with apt only as root")
def test_make_demo_names_the_apt_line_when_apt_leaves_a_tool_missing(repo: Path, tmp_path: Path) -> None:
    done, log = make_tools(repo, tmp_path, installs=False)
    assert done.returncode != 0
    assert "(not on PATH): sudo apt-get install -y debootstrap dpkg-dev" in done.stderr, done.stderr
    assert "install -y -qq --no-install-recommends debootstrap dpkg-dev" in log.read_text()


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
