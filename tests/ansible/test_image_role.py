"""The sparkfold_image role on this host against a fake ``docker`` and a TensorFold stand-in (a git
repository made by the test, tagged v0.6.0): build once, re-run changes nothing, a check run builds
nothing (a failed build, a rebuild and its rollback tag: test_image_rollback.py), an unpinned tag is
pinned and recorded on the control host, and a tag that moved stops the build in words."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest
from local_head import ansible, fake_tools, install_sparkfold, write_inventory

IMAGE = "sparkfold-tensorfold:v0.6.0"


def git(cwd: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org"}
    env |= {"GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.org"}
    done = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def commit_and_tag(source: Path, text: str) -> str:
    """A new commit in ``source`` with the annotated tag v0.6.0 moved onto it; its SHA."""
    (source / "README").write_text(text)
    git(source, "add", "README")
    git(source, "commit", "-q", "-m", text)
    git(source, "tag", "-f", "-a", "-m", "release", "v0.6.0")
    return git(source, "rev-parse", "HEAD")


@pytest.fixture
def tensorfold(tmp_path: Path) -> tuple[Path, str]:
    """The TensorFold stand-in and the commit its tag points to."""
    source = tmp_path / "tensorfold"
    source.mkdir()
    git(source, "init", "-q")
    return source, commit_and_tag(source, "v0.6.0")


@pytest.fixture
def pair(repo: Path, tmp_path: Path, tensorfold: tuple[Path, str]) -> Path:
    """A one-node inventory (the head, local connection, tp 1) with its own cache and settings folders."""
    write_inventory(
        tmp_path,
        sparkfold_cache_dir=str(tmp_path / "cache"),
        sparkfold_config_dir=str(tmp_path / "etc"),
        sparkfold_install_dir=str(install_sparkfold(repo, tmp_path / "install")),
        sparkfold_image_tensorfold_repo=str(tensorfold[0]),
        sparkfold_image_tensorfold_commit=tensorfold[1],
    )
    (tmp_path / "docker").mkdir()
    return tmp_path


def play(repo: Path, pair: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    env = {**fake_tools(repo, pair / "docker"), **env}
    return ansible(
        repo, "ansible-playbook", "-i", str(pair / "hosts.yml"), "playbooks/image.yml", *args, env=env
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
def test_a_venv_engine_has_no_image_and_touches_no_docker(repo: Path, pair: Path) -> None:
    """The plan's way is none: the stage says why and runs no Docker task, nothing is recorded."""
    run = play(repo, pair, "-e", "sparkfold_engine=transformers", "-e", "sparkfold_image_tensorfold_commit=")
    assert run.returncode == 0 and "changed=0" in recap(run), run.stdout + run.stderr
    said = " ".join(run.stdout.split())
    assert "nothing to build: the transformers engine runs inside the sparkfold venv" in said, run.stdout
    assert not (pair / "docker/calls").exists() and not (pair / "control/pins").exists()


def builds_so_far(pair: Path) -> int:
    return sum(line.startswith("build ") for line in (pair / "docker/calls").read_text().splitlines())


def pin_file(pair: Path) -> Path:
    return pair / "control/pins" / pair.name / "tensorfold-v0.6.0.commit"


@pytest.mark.slow
def test_an_unpinned_tag_is_pinned_recorded_and_then_held(
    repo: Path, pair: Path, tensorfold: tuple[Path, str]
) -> None:
    source, commit = tensorfold
    unpinned = ("-e", "sparkfold_image_tensorfold_commit=''")
    first = play(repo, pair, *unpinned)
    assert first.returncode == 0, first.stdout + first.stderr
    assert pin_file(pair).read_text().strip() == commit
    words = " ".join(first.stdout.split())
    assert "Copy it into the inventory" in words and f'sparkfold_image_tensorfold_commit: "{commit}"' in words
    dockerfile = (pair / "cache/image-build/Dockerfile").read_text()
    assert f'= "{commit}"' in dockerfile and label(pair) is not None

    again = play(repo, pair, *unpinned)
    assert again.returncode == 0 and "changed=0" in recap(again), again.stdout

    builds = builds_so_far(pair)
    moved = commit_and_tag(source, "v0.6.0, again")
    rebuild = play(repo, pair, *unpinned, "-e", '{"sparkfold_image_extras": ["av==18.1.0"]}')
    assert rebuild.returncode != 0
    words = " ".join(rebuild.stdout.split())
    assert f"the tag moved: v0.6.0 of {source} now points to {moved}, not the pinned {commit}" in words
    assert f"(and delete {pin_file(pair)})" in words
    assert builds_so_far(pair) == builds, "nothing is built from a moved tag"


@pytest.mark.slow
def test_a_tag_that_moved_from_the_inventory_pin_stops_the_build(
    repo: Path, pair: Path, tensorfold: tuple[Path, str]
) -> None:
    source, commit = tensorfold
    moved = commit_and_tag(source, "moved")
    failed = play(repo, pair)
    assert failed.returncode != 0
    words = " ".join(failed.stdout.split())
    assert f"now points to {moved}, not the pinned {commit} (sparkfold_image_tensorfold_commit)" in words
    assert f'set sparkfold_image_tensorfold_commit: "{moved}"' in words
    assert label(pair) is None


PATCH = (
    "--- tensorfold/engine.py\n+++ tensorfold/engine.py\n@@ -1,2 +1,2 @@\n-WINDOW = 2051\n+WINDOW = 1048576\n"
    " LANES = 1\n"
)


@pytest.fixture
def series(tmp_path: Path) -> tuple[Path, str, str]:
    """A repository holding patches/0001-window.patch at a commit: (repo, commit, the file's sha256)."""
    where = tmp_path / "recipe"
    (where / "patches").mkdir(parents=True)
    (where / "patches/0001-window.patch").write_text(PATCH)
    git(where, "init", "-q")
    git(where, "add", ".")
    git(where, "commit", "-q", "-m", "series")
    return where, git(where, "rev-parse", "HEAD"), hashlib.sha256(PATCH.encode()).hexdigest()


def series_ref(source: Path, commit: str, digest: str | None) -> str:
    """The series pinned by ``digest``; "" names the file without a digest, None lists no file."""
    files = [] if digest is None else [{"name": "0001-window.patch", "sha256": digest}]
    ref = {"repo": str(source), "commit": commit, "files": files, "supports": ["parallel", "kv_fp8"]}
    return json.dumps({"sparkfold_image_series_ref": ref, "sparkfold_image_extras": ["av==18.1.0"]})


@pytest.mark.slow
def test_an_external_series_is_fetched_verified_and_built_with_the_recipes_label(
    repo: Path, pair: Path, series: tuple[Path, str, str]
) -> None:
    source, commit, digest = series
    first = play(repo, pair, "-e", series_ref(source, commit, digest))
    assert first.returncode == 0, first.stdout + first.stderr
    dockerfile = (pair / "cache/image-build/Dockerfile").read_text()
    assert "apply_series.py /opt/sparkfold-build/external/series /opt/tensorfold/src" in dockerfile
    assert (pair / "cache/image-build/external/0001-window.patch").read_text() == PATCH
    shell = subprocess.run(
        [
            "bash",
            "-c",
            '{ cat "$1"/patches/*.patch; echo "av==18.1.0"; } | sha256sum | cut -c1-12',
            "_",
            str(source),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert f'tf.patches="{shell}"' in dockerfile
    profile = (pair / "etc/tensorfold-image.toml").read_text()
    assert 'supports = ["kv_fp8", "parallel"]' in profile and f"{source}@{commit}" in profile
    again = play(repo, pair, "-e", series_ref(source, commit, digest))
    assert again.returncode == 0 and "changed=0" in recap(again), again.stdout


@pytest.mark.slow
def test_a_tampered_series_file_stops_the_build_naming_it(
    repo: Path, pair: Path, series: tuple[Path, str, str]
) -> None:
    source, commit, _ = series
    failed = play(repo, pair, "-e", series_ref(source, commit, "0" * 64))
    assert failed.returncode != 0
    words = " ".join(failed.stdout.split())
    assert "the external series is refused: 0001-window.patch of" in words
    assert f"not the pinned {'0' * 64}" in words
    assert label(pair) is None and not (pair / "docker/calls").read_text().count("build ")


@pytest.mark.slow
@pytest.mark.parametrize("listed", [None, ""], ids=["no-files", "names-without-digests"])
def test_an_unpinned_series_is_recorded_and_then_held(
    repo: Path, pair: Path, series: tuple[Path, str, str], listed: str | None
) -> None:
    source, commit, digest = series
    first = play(repo, pair, "-e", series_ref(source, commit, listed))
    assert first.returncode == 0, first.stdout + first.stderr
    record = pair / "control/pins" / pair.name / f"series-{commit}.yml"
    assert digest in record.read_text()
    assert "copy them into the inventory" in " ".join(first.stdout.split())
    again = play(repo, pair, "-e", series_ref(source, commit, listed))
    assert again.returncode == 0 and "changed=0" in recap(again), again.stdout


PUBLISHED = "registry.test/miaai-lab/glm-5.3-flash-exl3-2x-dgx-sparks-tensorfold@sha256:" + "bc34" * 16


@pytest.mark.slow
def test_the_published_image_is_pulled_only_with_its_label(repo: Path, pair: Path) -> None:
    pinned = json.dumps(
        {"sparkfold_image_registry_ref": PUBLISHED, "sparkfold_image_published_label": "a1897d591f70"}
    )
    refused = play(repo, pair, "-e", pinned, FAKE_PULL_LABEL="0123456789ab")
    assert refused.returncode != 0
    words = " ".join(refused.stdout.split())
    assert f"{PUBLISHED} carries tf.patches=0123456789ab, not a1897d591f70" in words
    assert label(pair) is None, "a refused image is never tagged"
    accepted = play(repo, pair, "-e", pinned, FAKE_PULL_LABEL="a1897d591f70")
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
    assert label(pair) == "a1897d591f70"
    again = play(repo, pair, "-e", pinned, FAKE_PULL_LABEL="a1897d591f70")
    assert again.returncode == 0 and "changed=0" in recap(again), again.stdout


def task_results(
    result: subprocess.CompletedProcess[str], task: str, role: str = "sparkfold_image"
) -> list[str]:
    """The result lines (``ok: [h1]``, ``skipping: [h1]`` ...) under the task named ``task``."""
    lines = result.stdout.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith(f"TASK [{role} : {task}")]
    return [line for i in starts for line in lines[i + 1 : i + 4] if line.endswith("[h1]")]


MINIMAL = ("python3-apt", "git", "ca-certificates")


def minimal_node(folder: Path, path: str) -> dict[str, str]:
    """Environment (``path``: the PATH to extend) under which this host looks like a minimal head:
    dpkg lists none of ``MINIMAL`` as installed, and no Python finds python3-apt (a package ``apt``
    on PYTHONPATH that cannot be imported shadows the system's, also for the system Pythons the apt
    module probes)."""
    shim = folder / "bin/dpkg-query"
    shim.parent.mkdir(parents=True)
    rewrite = "|".join(MINIMAL)
    sed = f"sed -E 's/^({rewrite}) .*/\\1 not-installed/'"
    shim.write_text(f'#!/bin/sh\n/usr/bin/dpkg-query "$@" | {sed}\n')
    shim.chmod(0o755)
    (folder / "noapt/apt").mkdir(parents=True)
    (folder / "noapt/apt/__init__.py").write_text("raise ImportError('python3-apt is not installed')\n")
    return {"PATH": f"{shim.parent}:{path}", "PYTHONPATH": str(folder / "noapt")}


@pytest.mark.parametrize(("source", "installed"), [("git", True), ("context", False)])
def test_the_head_gets_git_for_a_git_source(
    repo: Path, pair: Path, tmp_path: Path, source: str, installed: bool
) -> None:
    """A minimal head has neither git nor python3-apt: the image stage installs git (and the CA
    certificates) with apt before it resolves the tag; a ready context needs neither. A check run
    only probes with dpkg-query and says what apt would install: apt's own check mode cannot start
    without python3-apt (roles/sparkfold/tasks/apt.yml)."""
    context = pair / "context"
    context.mkdir()
    (context / "Dockerfile").write_text("FROM scratch\n")
    node = minimal_node(tmp_path / "minimal", fake_tools(repo, pair / "docker")["PATH"])
    run = play(
        repo,
        pair,
        "--check",
        "-e",
        f"sparkfold_image_source={source}",
        "-e",
        f"sparkfold_image_context_dir={context}",
        **node,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    said = " ".join(run.stdout.split())
    wanted = "h1: would install with apt: python3-apt, git, ca-certificates (and what they depend on)"
    assert (wanted in said) is installed, run.stdout
    apt = task_results(run, "Install with apt git, ca-certificates (the head's Git tools)", role="sparkfold")
    assert apt == (["skipping: [h1]"] if installed else []), run.stdout


def without_git(folder: Path, path: str) -> str:
    """``path`` with git gone, as on a fresh head: each of its folders that holds ``git`` (or a
    ``git-*`` helper) is replaced by a folder of links to everything else in it."""
    kept = []
    for index, entry in enumerate(path.split(os.pathsep)):
        where = Path(entry)
        if not (where / "git").exists():
            kept.append(entry)
            continue
        farm = folder / f"path{index}"
        farm.mkdir(parents=True)
        for tool in where.iterdir():
            if tool.name != "git" and not tool.name.startswith("git-"):
                (farm / tool.name).symlink_to(tool)
        kept.append(str(farm))
    return os.pathsep.join(kept)


def fresh_head(folder: Path, repo: Path, pair: Path) -> dict[str, str]:
    """A minimal head (``minimal_node``) on which git is not installed either."""
    node = minimal_node(folder, fake_tools(repo, pair / "docker")["PATH"])
    return node | {"PATH": without_git(folder / "nogit", node["PATH"])}


@pytest.mark.parametrize(
    "pinned", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["unpinned", "pinned"]
)
def test_a_check_run_on_a_fresh_head_says_the_tag_and_series_come_at_the_real_run(
    repo: Path,
    pair: Path,
    tmp_path: Path,
    tensorfold: tuple[Path, str],
    series: tuple[Path, str, str],
    pinned: bool,
) -> None:
    """A head without git yet: a check run can neither resolve the tag (unpinned: to pin it; pinned:
    to check it did not move) nor fetch an external series, since the real run installs git first.
    It says so and goes on, recording nothing. Under ``--tags image``: the included series tasks
    carry the stage's tag too (tasks/main.yml)."""
    settings = json.loads(series_ref(*series)) | ({} if pinned else {"sparkfold_image_tensorfold_commit": ""})
    run = play(
        repo,
        pair,
        "--check",
        "--tags",
        "image",
        "-e",
        json.dumps(settings),
        **fresh_head(tmp_path / "fresh", repo, pair),
    )
    assert run.returncode == 0, run.stdout + run.stderr
    said = " ".join(run.stdout.split())
    assert "h1: would install with apt: python3-apt, git, ca-certificates" in said, run.stdout
    apt = "once this run has installed git, ca-certificates with apt; a check run cannot"
    assert f"h1: would resolve v0.6.0 of {tensorfold[0]} (git ls-remote) {apt}" in said, run.stdout
    assert f"h1: would fetch and verify the series {series[0]}@{series[1]}:patches {apt}" in said, run.stdout
    assert not (pair / "control/pins").exists() and label(pair) is None


@pytest.mark.slow
@pytest.mark.parametrize(
    ("fresh", "extra", "why"),
    [
        (True, {"sparkfold_image_head_packages": []}, "(git is not installed (not on PATH))"),
        (False, {"sparkfold_image_tensorfold_ref": "v0.6.6"}, "(no such tag)"),
    ],
    ids=["no-git-and-none-to-install", "git-and-no-such-tag"],
)
def test_a_check_run_that_cannot_resolve_the_tag_still_stops(
    repo: Path, pair: Path, tmp_path: Path, fresh: bool, extra: dict[str, object], why: str
) -> None:
    """Without git and nothing to install it (head_packages []), or with git and a tag that is not
    there, a check run stops as a real run would: nothing would install what is missing."""
    unpinned = {"sparkfold_image_tensorfold_commit": "", **extra}
    env = fresh_head(tmp_path / "fresh", repo, pair) if fresh else {}
    run = play(repo, pair, "--check", "-e", json.dumps(unpinned), **env)
    assert run.returncode != 0
    said = " ".join(run.stdout.split())
    assert f"cannot resolve {unpinned.get('sparkfold_image_tensorfold_ref', 'v0.6.0')} of" in said, run.stdout
    assert why in said, run.stdout
    assert not list((pair / "control").glob("pins/*/tensorfold-*.commit"))


BASE = "nvcr.io/nvidia/pytorch:26.07-py3"  # the role's default base, a tag


def base_pin(pair: Path) -> Path:
    return pair / "control/pins" / pair.name / "base-nvcr.io_nvidia_pytorch_26.07-py3.digest"


def pulls(pair: Path) -> int:
    calls = pair / "docker/calls"
    return calls.read_text().splitlines().count(f"pull {BASE}") if calls.exists() else 0


@pytest.mark.slow
def test_a_base_tag_is_pinned_by_digest_at_first_use_and_then_held(repo: Path, pair: Path) -> None:
    digest = "sha256:" + "b" * 64
    check = play(repo, pair, "--check", FAKE_BASE_DIGEST=digest)
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"would pull {BASE} and record its digest" in " ".join(check.stdout.split())
    assert not base_pin(pair).exists() and pulls(pair) == 0

    first = play(repo, pair, FAKE_BASE_DIGEST=digest)
    assert first.returncode == 0, first.stdout + first.stderr
    assert base_pin(pair).read_text().strip() == digest
    words = " ".join(first.stdout.split())
    assert f'Copy it into the inventory ({pair}/group_vars/all/image.yml): sparkfold_image_base: "' in words
    assert f'sparkfold_image_base: "{BASE}@{digest}"' in words
    assert f"FROM {BASE}@{digest}\n" in (pair / "cache/image-build/Dockerfile").read_text()
    built = label(pair)

    # The registry's tag moved: later runs keep the recorded digest (no pull, no rebuild).
    again = play(repo, pair, FAKE_BASE_DIGEST="sha256:" + "c" * 64)
    assert again.returncode == 0 and "changed=0" in recap(again), again.stdout
    assert pulls(pair) == 1 and "not a digest" not in again.stdout

    # The recorded digest copied into the inventory: the same series hash, nothing rebuilt.
    pinned = play(repo, pair, "-e", f"sparkfold_image_base={BASE}@{digest}")
    assert pinned.returncode == 0 and "changed=0" in recap(pinned), pinned.stdout
    assert label(pair) == built

    # An inventory digest that is not the recorded one stops the stage before any build, naming both.
    builds = builds_so_far(pair)
    other = "sha256:" + "d" * 64
    wrong = play(repo, pair, "-e", f"sparkfold_image_base={BASE}@{other}")
    assert wrong.returncode != 0
    words = " ".join(wrong.stdout.split())
    assert f"sparkfold_image_base pins {other}, but this control host recorded {digest}" in words
    assert "delete that file and run again" in words and str(base_pin(pair)) in words
    assert builds_so_far(pair) == builds
