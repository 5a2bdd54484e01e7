"""The runtime role's wheelhouse for nodes of another platform than the control host's.

Offline: a ``--find-links`` folder of tiny fake wheels (fakes/fake_wheels.py) stands in for the index,
a small project named ``sparkfold`` for this checkout, a folder of lock files pinning and hashing them
for requirements/, and a "node" is an interpreter that answers the role's platform probe for, say, an
aarch64 glibc 2.39 CPython 3.12 (the real probe's tag derivation, checked against ``packaging`` below).
tests/ansible/wheelhouse.yml runs only the wheelhouse tasks.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml
from packaging.tags import sys_tags

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fakes"))
from fake_wheels import add_sdist, add_wheel, write_project
from local_head import ansible, fake_tools, write_inventory

HERE = f"cp{sys.version_info[0]}{sys.version_info[1]}"  # this host's CPython, the control host's
ARCH = platform.machine()
FOREIGN = "aarch64" if ARCH != "aarch64" else "x86_64"  # a CPU the nodes have and this host has not


def load_probe(repo: Path) -> ModuleType:
    path = repo / "roles/sparkfold_runtime/files/platform_probe.py"
    spec = importlib.util.spec_from_file_location("platform_probe", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_probe_finds_the_tags_packaging_finds(repo: Path) -> None:
    probe = repo / "roles/sparkfold_runtime/files/platform_probe.py"
    found = json.loads(subprocess.run([sys.executable, str(probe)], capture_output=True, check=True).stdout)
    assert found["abi"] == HERE and found["python"] == "{}.{}".format(*sys.version_info[:2])
    platforms = list(dict.fromkeys(tag.platform for tag in sys_tags()))
    assert set(found["tags"]) == {p for p in platforms if p.startswith(("manylinux", "linux_"))}
    assert [t for t in found["tags"] if t.startswith("manylinux")] == [
        p for p in platforms if p.startswith("manylinux")
    ]


def test_the_probe_derives_an_aarch64_nodes_tags(repo: Path) -> None:
    tags = load_probe(repo).manylinux_tags("aarch64", "2.39")
    assert tags[0] == "manylinux_2_39_aarch64" and tags[-1] == "linux_aarch64"
    assert tags[tags.index("manylinux_2_17_aarch64") + 1] == "manylinux2014_aarch64"
    assert "manylinux_2_40_aarch64" not in tags and "manylinux_2_16_aarch64" not in tags
    assert len(tags) == 39 - 17 + 1 + 2  # 2_39 .. 2_17, manylinux2014, linux
    assert "manylinux1_x86_64" in load_probe(repo).manylinux_tags("x86_64", "2.36")


@pytest.fixture
def index(tmp_path: Path) -> Path:
    """The wheels an index would have: binary ones for this host and for the foreign CPU (CPython 3.12),
    pure ones, an abi3 one, newer releases only for a newer glibc, and a package only as an sdist."""
    folder = tmp_path / "index"
    folder.mkdir()
    for arch, abi in ((ARCH, HERE), (FOREIGN, "cp312"), (ARCH, "cp312")):
        add_wheel(folder, "fakecore", "1.0", f"{abi}-{abi}-manylinux_2_17_{arch}", ["fakepure>=1", "fakeabi"])
        add_wheel(folder, "fakeabi", "1.0", f"cp38-abi3-manylinux_2_17_{arch}")
        add_wheel(folder, "faketorch", "1.0", f"{abi}-{abi}-manylinux_2_28_{arch}")
    add_wheel(folder, "fakecore", "2.0", f"cp312-cp312-manylinux_2_41_{FOREIGN}", ["fakepure>=1"])
    add_wheel(folder, "fakecore", "1.5", f"{HERE}-{HERE}-manylinux_2_18_{ARCH}", ["fakepure>=1", "fakeabi"])
    add_wheel(folder, "fakepure", "1.0", "py3-none-any")
    add_wheel(folder, "fakemodel", "1.0", "py3-none-any")
    add_sdist(folder, "fakesdist", "1.0")
    return folder


# What the lock pins per set (requirements/lock.py's sets): fakecore 1.0 though the index has newer.
LOCKED = ["fakecore==1.0", "fakeabi==1.0", "fakepure==1.0"]
LOCK_SETS = {"node": LOCKED, "cpu": [*LOCKED, "faketorch==1.0"], "exllamav3": [*LOCKED, "fakesdist==1.0"]}


def write_locks(folder: Path, index: Path) -> Path:
    """Lock files as `make lock` writes them, for every set on this CPU and the foreign one, CPython
    3.12 and this host's: each pin with the sha256 of every file of that release in ``index``."""
    folder.mkdir()
    pythons = {"312", HERE[2:]}
    for group, pins in LOCK_SETS.items():
        lines = []
        for pin in pins:
            name, version = pin.split("==")
            files = sorted(index.glob(f"{name}-{version}-*.whl")) + sorted(
                index.glob(f"{name}-{version}.tar.gz")
            )
            hashes = [f"--hash=sha256:{hashlib.sha256(f.read_bytes()).hexdigest()}" for f in files]
            lines.append(" \\\n    ".join([pin, *hashes]))
        for python in pythons:
            for arch in (ARCH, FOREIGN):
                (folder / f"{group}-py{python}-{arch}.txt").write_text("\n".join(lines) + "\n")
    return folder


def fake_node(folder: Path, arch: str, abi: str, glibc: str, repo: Path) -> Path:
    """An interpreter that answers the platform probe as a node of ``arch``, CPython ``abi``, glibc."""
    answer = {
        "platform": f"linux-{arch}",
        "python": f"{abi[2]}.{abi[3:]}",
        "abi": abi,
        "tags": load_probe(repo).manylinux_tags(arch, glibc) if glibc else [],
    }
    path = folder / f"python-{arch}-{abi}-{glibc or 'musl'}"
    path.write_text(f"#!/bin/sh\necho '{json.dumps(answer)}'\n")
    path.chmod(0o755)
    return path


def build_wheelhouse(
    repo: Path,
    tmp_path: Path,
    index: Path,
    node_python: str | dict[str, str],
    engine: str,
    tasks_file: str = "wheelhouse.yml",
    build_requires: tuple[str, ...] = ("setuptools>=69",),
    extra: dict[str, str] | None = None,
    git: bool = False,
    check: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run ``tasks_file`` of the runtime role (tests/ansible/wheelhouse.yml) for the fake sparkfold
    project (a git work tree with ``git``); ``node_python`` per host (``{"h1": ..., "h2": ...}``
    makes ``h2`` the worker)."""
    locks = tmp_path / "locks"
    source = write_project(
        tmp_path / "src",
        "sparkfold",
        ["fakecore>=1"],
        {"cpu": ["faketorch>=1"], "exllamav3": ["fakesdist>=1"]},
        build_requires,
    )
    if git and not (source / ".git").exists():
        subprocess.run(["git", "init", "-q", str(source)], check=True)
    pythons = node_python if isinstance(node_python, dict) else {"h1": node_python}
    hosts = write_inventory(
        tmp_path,
        sparkfold_engine=engine,
        sparkfold_runtime_source_dir=str(source),
        # written once per test: a later call (and a test that changes the index after) keeps them
        sparkfold_runtime_lock_dir=str(locks if locks.exists() else write_locks(locks, index)),
        sparkfold_runtime_nodeps_packages=["fakemodel"],
        sparkfold_runtime_pip_options=["--no-index", "--find-links", str(index)],
        sparkfold_install_dir=str(tmp_path / "install"),
        **(extra or {}),
    )
    inventory = yaml.safe_load(hosts.read_text())
    groups = inventory["sparkfold_nodes"]["children"]
    head = groups["sparkfold_head"]["hosts"]["h1"]
    for name, python in pythons.items():
        host = head if name == "h1" else {**head, "sparkfold_fabric_address": "203.0.113.2"}
        host["sparkfold_runtime_python"] = python
        (groups["sparkfold_head"] if name == "h1" else groups["sparkfold_worker"])["hosts"][name] = host
    hosts.write_text(yaml.safe_dump(inventory))
    # Only the test's folder is an index: this host's pip.conf and PIP_* settings stay out.
    env: dict[str, str | None] = {key: None for key in os.environ if key.startswith("PIP_")}
    env |= {"PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env |= fake_tools(repo, tmp_path)  # the restart handlers' systemctl: no unit is installed here
    playbook = [
        "tests/ansible/wheelhouse.yml",
        "-e",
        f"tasks_file={tasks_file}",
        *(["--check"] if check else []),
    ]
    return ansible(repo, "ansible-playbook", "-i", str(hosts), *playbook, env=env)


def test_the_sparkfold_wheel_is_built_again_only_when_the_checkout_changed(
    repo: Path, tmp_path: Path, index: Path
) -> None:
    node = str(fake_node(tmp_path, ARCH, HERE, "2.39", repo))
    wheel = tmp_path / "control/wheelhouse/app/sparkfold-0.1-py3-none-any.whl"

    def build(check: bool = False) -> bool | None:
        result = build_wheelhouse(repo, tmp_path, index, node, engine="transformers", git=True, check=check)
        assert result.returncode == 0, result.stdout + result.stderr
        assert wheel.is_file(), result.stdout
        return _ran(result, "Build the sparkfold wheel")

    assert build() is True
    assert build(check=True) is True  # into its scratch folder, leaving the wheelhouse as it was
    assert build() is False  # the same checkout: the wheelhouse's wheel is its wheel
    (tmp_path / "src/sparkfold/extra.py").write_text("CHANGED = True\n")  # a new file git sees
    assert build() is True


def wheelhouses(tmp_path: Path) -> dict[str, set[str]]:
    """Each dependency wheelhouse on the control host: its folder name -> the files in it."""
    deps = tmp_path / "control/wheelhouse/deps"
    return {folder.name: {f.name for f in folder.iterdir()} for folder in deps.iterdir()}


@pytest.mark.slow
def test_nodes_of_another_platform_get_binary_wheels_for_theirs(
    repo: Path, tmp_path: Path, index: Path
) -> None:
    node = fake_node(tmp_path, FOREIGN, "cp312", "2.39", repo)
    result = build_wheelhouse(repo, tmp_path, index, str(node), engine="transformers")  # the cpu extra
    assert result.returncode == 0, result.stdout + result.stderr
    [(name, files)] = wheelhouses(tmp_path).items()
    assert name.startswith(f"linux-{FOREIGN}-cp312-")
    assert files == {
        ".complete",
        f"fakecore-1.0-cp312-cp312-manylinux_2_17_{FOREIGN}.whl",  # 2.0 needs glibc 2.41
        f"fakeabi-1.0-cp38-abi3-manylinux_2_17_{FOREIGN}.whl",
        f"faketorch-1.0-cp312-cp312-manylinux_2_28_{FOREIGN}.whl",  # the cpu extra, for the nodes too
        "fakepure-1.0-py3-none-any.whl",
        "fakemodel-1.0-py3-none-any.whl",  # sparkfold_runtime_nodeps_packages
    }
    assert [w.name for w in (tmp_path / "control/wheelhouse/app").iterdir()] == [
        "sparkfold-0.1-py3-none-any.whl"
    ]

    # A pair of another platform (this host's CPU, but CPython 3.12) gets a wheelhouse of its own.
    other = fake_node(tmp_path, ARCH, "cp312", "2.39", repo)
    result = build_wheelhouse(repo, tmp_path, index, str(other), engine="transformers")
    assert result.returncode == 0, result.stdout + result.stderr
    found = wheelhouses(tmp_path)
    assert len(found) == 2 and found[name] == files  # the first one untouched
    [(other_name, other_files)] = ((n, f) for n, f in found.items() if n != name)
    assert other_name.startswith(f"linux-{ARCH}-cp312-")
    assert any(
        f.startswith("fakecore-") and "-cp312-cp312-manylinux_2_1" in f and f.endswith(f"_{ARCH}.whl")
        for f in other_files
    )
    assert not any(FOREIGN in f for f in other_files)

    # The first pair again: the same key (its tags in the same order), so nothing is fetched again.
    complete = tmp_path / "control/wheelhouse/deps" / name / ".complete"
    before = complete.stat().st_mtime_ns
    result = build_wheelhouse(repo, tmp_path, index, str(node), engine="transformers")
    assert result.returncode == 0, result.stdout + result.stderr
    assert set(wheelhouses(tmp_path)) == {name, other_name}
    assert complete.stat().st_mtime_ns == before


def test_a_wheelhouse_fetched_for_the_nodes_installs_there_offline(
    repo: Path, tmp_path: Path, index: Path
) -> None:
    # This host as a node whose glibc is older than the control host's: the control host's own pip
    # might pick wheels it cannot take, so its wheels are fetched for its tags, and they install here.
    answer = {
        "platform": f"linux-{ARCH}",
        "python": "{}.{}".format(*sys.version_info[:2]),
        "abi": HERE,
        "tags": load_probe(repo).manylinux_tags(ARCH, "2.17"),
    }
    node = tmp_path / "python-old-glibc"
    node.write_text(
        f"#!/bin/sh\ncase \"$1\" in *platform_probe.py) echo '{json.dumps(answer)}'; exit 0;; esac\n"
        f'exec {sys.executable} "$@"\n'
    )
    node.chmod(0o755)

    def install() -> subprocess.CompletedProcess[str]:
        return build_wheelhouse(repo, tmp_path, index, str(node), "tensorfold", tasks_file="install.yml")

    result = install()
    assert result.returncode == 0, result.stdout + result.stderr
    [name] = wheelhouses(tmp_path)
    assert name.startswith(f"linux-{ARCH}-{HERE}-")
    venv = tmp_path / "install/venv/bin/python"
    listed = subprocess.run([str(venv), "-m", "pip", "list", "--format=json"], capture_output=True, text=True)
    installed = {p["name"]: p["version"] for p in json.loads(listed.stdout)}
    # the lock's fakecore 1.0 (1.5 needs glibc 2.18: the control host's own pip would pick it unlocked)
    assert (
        installed.items()
        >= {"sparkfold": "0.1", "fakecore": "1.0", "fakeabi": "1.0", "fakepure": "1.0"}.items()
    )
    lock = tmp_path / "locks" / f"node-py{HERE[2:]}-{ARCH}.txt"
    recorded = (tmp_path / "install/venv/sparkfold-lock").read_text()
    assert recorded == f"{lock.name} sha256:{hashlib.sha256(lock.read_bytes()).hexdigest()}\n"
    shipped = {p.name for p in (tmp_path / "install/wheelhouse/deps").iterdir()}
    assert f"fakecore-1.0-{HERE}-{HERE}-manylinux_2_17_{ARCH}.whl" in shipped and ".complete" not in shipped

    again = install()
    assert again.returncode == 0 and _ran_install(again) is False, again.stdout  # the venv's stamp matches

    # A wheelhouse without a dependency the node's pip wants (as when the control host's Python read a
    # marker its own way) stops the install in words, on a fresh node; and again on the next run, though
    # that run copies nothing new (the failed run left no stamp in the venv).
    missing = tmp_path / "control/wheelhouse/deps" / name / "fakepure-1.0-py3-none-any.whl"
    kept = missing.read_bytes()
    missing.unlink()
    shutil.rmtree(tmp_path / "install/venv")
    for _ in range(2):
        result = install()
        assert result.returncode != 0, result.stdout
        said = " ".join(result.stdout.split())
        assert (
            f"the wheelhouse has no fakepure, which node-py{HERE[2:]}-{ARCH}.txt lists and pip on h1" in said
        )
        assert "the cached wheelhouse is incomplete. Delete" in said
    missing.write_bytes(kept)  # the wheelhouse repaired: the next run installs
    result = install()
    assert result.returncode == 0 and _ran_install(result) is True, result.stdout


def _ran(result: subprocess.CompletedProcess[str], task_name: str) -> bool | None:
    """Whether the play ran the runtime role's task named ``task_name…`` (None: not in its output)."""
    for task in result.stdout.split("TASK ["):
        if task.startswith(f"sparkfold_runtime : {task_name}"):
            return "skipping:" not in task
    return None


def _ran_install(result: subprocess.CompletedProcess[str]) -> bool | None:
    return _ran(result, "Install the lock's packages offline")


def test_a_dependency_without_a_wheel_for_the_nodes_stops_in_words(
    repo: Path, tmp_path: Path, index: Path
) -> None:
    node = fake_node(tmp_path, FOREIGN, "cp312", "2.39", repo)
    result = build_wheelhouse(repo, tmp_path, index, str(node), engine="exllamav3")  # needs fakesdist
    assert result.returncode != 0, result.stdout
    said = " ".join(result.stdout.split())
    assert (
        f"fakesdist has no binary wheel for the nodes' platform linux-{FOREIGN} cp312 "
        f"(manylinux_2_39_{FOREIGN} down to manylinux_2_17_{FOREIGN})"
    ) in said
    assert "Run ansible-playbook from a host of the nodes' platform" in said
    assert "sparkfold_runtime_pip_options" in said
    [files] = wheelhouses(tmp_path).values()
    assert ".complete" not in files  # not taken for a finished wheelhouse next time


def test_nodes_of_the_control_hosts_platform_get_the_locked_files(
    repo: Path, tmp_path: Path, index: Path
) -> None:
    result = build_wheelhouse(repo, tmp_path, index, sys.executable, engine="exllamav3")
    assert result.returncode == 0, result.stdout + result.stderr
    [(name, files)] = wheelhouses(tmp_path).items()
    assert name.startswith(f"linux-{ARCH}-{HERE}-")
    assert "fakesdist-1.0.tar.gz" in files  # as the lock hashed it (the node builds it)
    assert f"fakecore-1.0-{HERE}-{HERE}-manylinux_2_17_{ARCH}.whl" in files  # the lock's, not the newest
    assert not any(f.startswith("fakecore-1.5") for f in files)
    assert ".complete" in files and not any(FOREIGN in f for f in files)


def test_a_file_that_does_not_match_the_locks_hash_stops_the_fill(
    repo: Path, tmp_path: Path, index: Path
) -> None:
    write_locks(tmp_path / "locks", index)  # hashed before the index's fakepure is replaced
    add_wheel(index, "fakepure", "1.0", "py3-none-any", ["fakeabi"])  # another file under the same name
    result = build_wheelhouse(repo, tmp_path, index, sys.executable, engine="tensorfold")
    assert result.returncode != 0, result.stdout
    said = " ".join(result.stdout.split())
    assert "pip could not fill the wheelhouse" in said and "DO NOT MATCH THE HASHES" in said
    [files] = wheelhouses(tmp_path).values()
    assert ".complete" not in files


def test_an_inventory_that_still_pins_torch_stops_naming_the_setting(
    repo: Path, tmp_path: Path, index: Path
) -> None:
    result = build_wheelhouse(
        repo,
        tmp_path,
        index,
        sys.executable,
        "transformers",
        extra={"sparkfold_runtime_torch_requirement": "torch==2.4"},
    )
    assert result.returncode != 0, result.stdout
    said = " ".join(result.stdout.split())
    assert "sparkfold_runtime_torch_requirement is gone: the lock pins torch for each platform" in said
    assert not (tmp_path / "control" / "wheelhouse").exists()


def test_nodes_of_a_python_the_lock_lacks_stop_naming_the_file(
    repo: Path, tmp_path: Path, index: Path
) -> None:
    node = fake_node(tmp_path, FOREIGN, "cp313", "2.39", repo)
    result = build_wheelhouse(repo, tmp_path, index, str(node), engine="transformers")
    assert result.returncode != 0, result.stdout
    said = " ".join(result.stdout.split())
    assert (
        f"the lock has no {tmp_path}/locks/cpu-py313-{FOREIGN}.txt for the nodes (linux-{FOREIGN} cp313"
        in said
    )
    assert "add theirs to requirements/lock.py and run `make lock`" in said
    assert not (tmp_path / "control" / "wheelhouse").exists()  # stopped before building anything


def test_a_control_host_python_without_the_build_requirements_stops_naming_them(
    repo: Path, tmp_path: Path, index: Path
) -> None:
    # As a fresh venv with only ansible-core in it: the wheel is built without build isolation, and
    # setuptools (or, here, another build requirement) is missing or older than pyproject.toml asks.
    missing = ("setuptools>=61", "sparkfold-build-helper>=1")
    result = build_wheelhouse(repo, tmp_path, index, sys.executable, "tensorfold", build_requires=missing)
    assert result.returncode != 0, result.stdout
    said = " ".join(result.stdout.split())
    assert "the Python that runs ansible-playbook (" in said
    assert ") could not build the sparkfold wheel from" in said
    assert "are missing: 'sparkfold-build-helper>=1'" in said  # pip's own words
    assert "-m pip install 'setuptools>=61' 'sparkfold-build-helper>=1', or run ansible-playbook" in said
    assert not list((tmp_path / "control/wheelhouse").rglob("*.whl"))  # stopped before fetching anything


def test_the_checkouts_build_requirements_hold_its_license_field(repo: Path) -> None:
    # `license = "<SPDX expression>"` (PEP 639) needs setuptools 77; an older one fails the build.
    text = (repo / "pyproject.toml").read_text()
    assert 'license = "' in text and '"setuptools>=77"' in text


def test_nodes_of_two_platforms_stop_naming_both(repo: Path, tmp_path: Path, index: Path) -> None:
    node = fake_node(tmp_path, FOREIGN, "cp312", "2.39", repo)
    pythons = {"h1": str(node), "h2": sys.executable}
    result = build_wheelhouse(repo, tmp_path, index, pythons, engine="tensorfold")
    assert result.returncode != 0, result.stdout
    said = " ".join(result.stdout.split())
    assert f"h1 runs linux-{FOREIGN} cp312, h2 runs linux-{ARCH} {HERE}: the nodes install from one" in said
    assert not (tmp_path / "control" / "wheelhouse").exists()  # stopped before building anything


@pytest.mark.slow
def test_nodes_without_glibc_of_another_platform_stop_in_words(
    repo: Path, tmp_path: Path, index: Path
) -> None:
    node = fake_node(tmp_path, FOREIGN, "cp312", "", repo)
    result = build_wheelhouse(repo, tmp_path, index, str(node), engine="tensorfold")
    assert result.returncode != 0, result.stdout
    said = " ".join(result.stdout.split())
    assert f"the nodes run linux-{FOREIGN} cp312 without glibc" in said
    assert not (tmp_path / "control" / "wheelhouse").exists()
