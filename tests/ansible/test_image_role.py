"""The sparkfold_image role on this host against a fake ``docker`` and a TensorFold stand-in (a git
repository made by the test, tagged v0.6.0): build once, re-run changes nothing, a failed build names
the patch and leaves the previous image, a check run builds nothing, an unpinned tag is pinned and
recorded on the control host, and a tag that moved stops the build in words."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from local_head import ansible, fake_tools, write_inventory

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
def pair(tmp_path: Path, tensorfold: tuple[Path, str]) -> Path:
    """A one-node inventory (the head, local connection, tp 1) with its own cache folder."""
    write_inventory(
        tmp_path,
        sparkfold_cache_dir=str(tmp_path / "cache"),
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
def test_failed_build_names_the_patch_and_keeps_the_previous_image(repo: Path, pair: Path) -> None:
    assert play(repo, pair).returncode == 0
    before = label(pair)
    failed = play(repo, pair, "-e", '{"sparkfold_image_extras": ["av==18.1.0"]}', FAKE_BUILD_FAIL="1")
    assert failed.returncode != 0
    assert "previous image (if any) is unchanged" in failed.stdout
    assert "patch 0007-window.patch does not apply" in failed.stdout
    assert label(pair) == before
    assert not (pair / "docker" / f"image-{IMAGE.replace(':', '_')}-building").exists()


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
