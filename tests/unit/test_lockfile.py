"""The lock a venv was installed from (sparkfold.lockfile), as sparkfold doctor shows it, and
requirements/lock.py's check that the lock is not out of date with pyproject.toml."""

from __future__ import annotations

import hashlib
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from sparkfold import lockfile
from sparkfold.node.doctor import Doctor, as_dict

REPO = Path(__file__).resolve().parents[2]


def test_a_venv_records_the_lock_it_was_installed_from(tmp_path: Path) -> None:
    lock = tmp_path / "cpu-py311-x86_64.txt"
    lock.write_text("torch==2.13.0+cpu \\\n    --hash=sha256:00\n")
    venv = tmp_path / "venv"
    venv.mkdir()
    assert lockfile.installed(venv) is None
    said = subprocess.run(
        [sys.executable, "-m", "sparkfold.lockfile", "record", str(lock), str(venv)],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(REPO / "runtime")},
    ).stdout
    found = lockfile.installed(venv)
    assert found == lockfile.Installed(lock.name, hashlib.sha256(lock.read_bytes()).hexdigest())
    assert said.strip() == found.line()


def test_doctor_names_the_version_commit_and_lock(tmp_path: Path) -> None:
    lock = tmp_path / "node-py312-aarch64.txt"
    lock.write_text("fastapi==0.165.0\n")
    lockfile.record(lock, tmp_path)
    version = as_dict(Doctor(None, venv=tmp_path).gather())["sections"]["version"]
    digest = hashlib.sha256(lock.read_bytes()).hexdigest()
    assert version["data"]["lock"] == f"node-py312-aarch64.txt sha256:{digest}"
    assert f"lock node-py312-aarch64.txt sha256:{digest[:16]}" in version["summary"]
    assert "(commit " in version["summary"]
    bare = as_dict(Doctor(None, venv=tmp_path / "elsewhere").gather())["sections"]["version"]
    assert bare["data"]["lock"] is None and "no lock recorded" in bare["summary"]


def _lock_module(root: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("lock", root / "requirements/lock.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_checked_in_lock_is_up_to_date() -> None:
    assert _lock_module(REPO).check() == []


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """The checkout's pyproject.toml and requirements/ in a folder of their own."""
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    shutil.copytree(REPO / "requirements", tmp_path / "requirements")
    return tmp_path


def test_a_dependency_changed_without_make_lock_fails_the_check(copy: Path) -> None:
    pyproject = copy / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('"uvicorn>=0.55,<0.56"', '"uvicorn>=0.56"'))
    problems = _lock_module(copy).check()
    assert "requirements/dev-py311-x86_64.txt was compiled from another pyproject.toml or lock.py" in problems
    said = subprocess.run(
        [sys.executable, str(copy / "requirements/lock.py"), "check"], capture_output=True, text=True
    )
    assert said.returncode == 1 and "run `make lock` and commit requirements/" in said.stderr


def test_a_missing_or_stray_lock_file_fails_the_check(copy: Path) -> None:
    (copy / "requirements/node-py312-aarch64.txt").unlink()
    (copy / "requirements/mine.txt").write_text("click==8.1\n")
    problems = _lock_module(copy).check()
    assert problems == [
        "requirements/node-py312-aarch64.txt is missing",
        "requirements/mine.txt is no lock file of lock.py's",
    ]


def test_a_comment_or_tool_change_outside_the_inputs_keeps_the_lock(copy: Path) -> None:
    pyproject = copy / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace("line-length = 110", "line-length = 100"))
    assert _lock_module(copy).check() == []


def test_entry_is_one_packages_pin_with_its_hashes(copy: Path) -> None:
    lock = copy / "requirements/dev-py311-x86_64.txt"
    uv = _lock_module(copy).entry(lock, "uv")
    lines = uv.splitlines()
    assert lines[0].startswith("uv==") and lines[0].endswith(" \\")
    assert all(line.strip().startswith("--hash=sha256:") for line in lines[1:])
    assert not lines[-1].endswith("\\") and uv in lock.read_text()
    with pytest.raises(SystemExit, match="pins no uv-not-locked: run `make lock`"):
        _lock_module(copy).entry(lock, "uv-not-locked")


def test_uv_installs_from_where_pips_configuration_says() -> None:
    config = (
        "global.extra-index-url='file:///srv/simple file:///srv/more'\n"
        "global.find-links='/srv/wheels'\n"
        "global.cert='/etc/ssl/certs/ca-certificates.crt'\n"
        ":env:.find-links='/opt/wheels'\n"
        "install.index-url='https://index.example/simple'\n"
    )
    args = _lock_module(REPO).uv_sources(config)
    assert args == [
        "--extra-index-url", "file:///srv/simple", "--extra-index-url", "file:///srv/more",
        "--find-links", "/opt/wheels",
        "--index-url", "https://index.example/simple",
        "--index-strategy", "unsafe-best-match",
    ]  # fmt: skip
    assert _lock_module(REPO).uv_sources("") == ["--index-strategy", "unsafe-best-match"]
