"""An external patch series by reference, through the commands the image role runs: a git repository
made here holds a small -p0 series (the recipe's form: paths inside the installed package / src/);
``sparkfold image fetch`` fetches it at a commit and verifies each file's sha256, ``image apply`` applies
it to a TensorFold-shaped tree, ``image hash`` and ``image label`` hash it. The label is checked against
the recipe's formula computed by the shell (cat + echo | sha256sum); a tampered file stops the fetch
naming it; a published image with another label is refused (tests/fakes/docker)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from sparkfold.cli import main

EXTRAS = ["av==18.1.0", "xgrammar>=0.2.8,<0.3"]
ENGINE = "def window():\n    return 2051\n\n\ndef lanes():\n    return 1\n"
PATCHES = {  # as `diff -u` writes them against an installed package (the recipe's -p0 form)
    "0001-glm-window.patch": (
        "--- tensorfold/engine.py\n+++ tensorfold/engine.py\n@@ -1,5 +1,5 @@\n def window():\n"
        "-    return 2051\n+    return 1048576\n \n \n def lanes():\n"
    ),
    "0002-glm-lanes.patch": (
        "--- tensorfold/engine.py\n+++ tensorfold/engine.py\n@@ -3,4 +3,4 @@\n \n \n def lanes():\n"
        "-    return 1\n+    return 4\n"
    ),
}


def git(cwd: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org"}
    env |= {"GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.org"}
    done = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=True)
    return done.stdout.strip()


@pytest.fixture
def recipe(tmp_path: Path) -> tuple[Path, str]:
    """A repository like the recipe's: patches/*.patch at a commit; returns (repo, commit)."""
    where = tmp_path / "recipe"
    (where / "patches").mkdir(parents=True)
    for name, text in PATCHES.items():
        (where / "patches" / name).write_text(text)
    (where / "patches/README.md").write_text("not a patch\n")
    git(where, "init", "-q")
    git(where, "add", ".")
    git(where, "commit", "-q", "-m", "series")
    return where, git(where, "rev-parse", "HEAD")


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A TensorFold checkout's shape: src/tensorfold/engine.py."""
    (tmp_path / "tensorfold/src/tensorfold").mkdir(parents=True)
    (tmp_path / "tensorfold/src/tensorfold/engine.py").write_text(ENGINE)
    return tmp_path / "tensorfold"


def sha(name: str) -> str:
    return hashlib.sha256(PATCHES[name].encode()).hexdigest()


def sparkfold(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def fetch(repo: Path, commit: str, dest: Path, *pins: str) -> Result:
    args = ["image", "fetch", "--repo", str(repo), "--commit", commit, "--dest", str(dest), "--json"]
    return sparkfold(*args, *(f"--file={pin}" for pin in pins))


def test_fetched_verified_applied_and_hashed(recipe: tuple[Path, str], tree: Path, tmp_path: Path) -> None:
    repo, commit = recipe
    pins = [f"{name}={sha(name)}" for name in PATCHES]
    first = fetch(repo, commit, tmp_path / "fetched", *pins)
    assert first.exit_code == 0, first.output
    done = json.loads(first.output)
    assert done["fetched"] and done["unpinned"] == []
    assert [f["name"] for f in done["files"]] == list(PATCHES)
    series = Path(done["series"])
    assert "0001-glm-window.patch -p0" in series.read_text().splitlines()

    again = fetch(repo, commit, tmp_path / "fetched", *pins)
    assert again.exit_code == 0 and not json.loads(again.output)["fetched"], "the commit is there already"

    applied = sparkfold("image", "apply", "--series", str(series), "--tree", str(tree / "src"), "--json")
    assert applied.exit_code == 0, applied.output
    engine = (tree / "src/tensorfold/engine.py").read_text()
    assert "return 1048576" in engine and "return 4" in engine

    ours = tmp_path / "ours/series"
    ours.parent.mkdir()
    ours.write_text("# empty\n")
    common = ["image", "hash", "--series", str(ours), "--base", "b", "--ref", "v0.6.0@" + "a" * 40, "--json"]
    source = ["--external-source", f"{repo}@{commit}:patches"]
    with_series = sparkfold(*common, *source, *(f"--external={pin}" for pin in pins))
    without = sparkfold(*common)
    assert with_series.exit_code == 0 and without.exit_code == 0, with_series.output
    assert json.loads(with_series.output)["hash"] != json.loads(without.output)["hash"]


def test_label_is_the_recipes_formula(recipe: tuple[Path, str], tmp_path: Path) -> None:
    repo, commit = recipe
    done = json.loads(fetch(repo, commit, tmp_path / "fetched").output)
    assert done["unpinned"] == list(PATCHES), "no pins given: every *.patch, digests to record"
    assert {f["name"]: f["sha256"] for f in done["files"]} == {name: sha(name) for name in PATCHES}
    extras = " ".join(EXTRAS)
    shell = subprocess.run(
        [
            "bash",
            "-c",
            'cd "$1" && { cat patches/*.patch; echo "$2"; } | sha256sum | cut -c1-12',
            "_",
            str(repo),
            extras,
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    label = sparkfold("image", "label", "--series", done["series"], *(f"--extra={e}" for e in EXTRAS))
    assert label.exit_code == 0, label.output
    assert label.output.strip() == shell and len(shell) == 12
    other = sparkfold("image", "label", "--series", done["series"], "--extra=av==18.1.0")
    assert other.output.strip() != shell, "the extras are part of the label"


def test_a_tampered_file_stops_the_fetch_naming_it(recipe: tuple[Path, str], tmp_path: Path) -> None:
    repo, _ = recipe
    pins = [f"{name}={sha(name)}" for name in PATCHES]
    (repo / "patches/0002-glm-lanes.patch").write_text(PATCHES["0002-glm-lanes.patch"].replace("4", "8"))
    git(repo, "commit", "-q", "-am", "tampered")
    tampered = git(repo, "rev-parse", "HEAD")
    failed = fetch(repo, tampered, tmp_path / "fetched", *pins)
    assert failed.exit_code == 1
    words = " ".join(failed.output.split())
    assert f"0002-glm-lanes.patch of {repo}@{tampered[:12]}:patches has sha256" in words
    assert f"not the pinned {sha('0002-glm-lanes.patch')}" in words and "nothing was applied" in words
    assert not (tmp_path / "fetched/series/series").exists()


def test_a_tag_or_a_missing_commit_is_refused(recipe: tuple[Path, str], tmp_path: Path) -> None:
    repo, _ = recipe
    assert "a full 40-hex commit, not 'v1.10'" in fetch(repo, "v1.10", tmp_path / "f").output
    missing = fetch(repo, "0" * 40, tmp_path / "f")
    assert missing.exit_code == 1 and f"has no commit {'0' * 40}" in missing.output


FAKES = Path(__file__).resolve().parents[2] / "fakes"
REF = "registry.test/miaai-lab/glm-5.3-flash-exl3-2x-dgx-sparks-tensorfold@sha256:" + "bc34" * 16


def pull(
    tmp_path: Path, label: str, published: str, *more: str, **fake: str
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        **fake,
        "PATH": f"{FAKES}:{os.environ['PATH']}",
        "FAKE_DOCKER_DIR": str(tmp_path),
        "FAKE_DOCKER_PULL_LABEL": published,
        "PYTHONPATH": os.pathsep.join(sys.path),
    }
    argv = [sys.executable, "-c", "from sparkfold.cli import main; main()", "image", "pull"]
    argv += ["--ref", REF, "--label", label, "--tag", "sparkfold-tensorfold:v0.6.0-recipe", "--json", *more]
    return subprocess.run(argv, env=env, capture_output=True, text=True, check=False, timeout=60)


def test_a_published_image_with_another_label_is_refused(tmp_path: Path) -> None:
    refused = pull(tmp_path, "a1897d591f70", "0123456789ab")
    assert refused.returncode == 1
    words = " ".join(refused.stderr.split())
    assert f"{REF} carries tf.patches=0123456789ab, not a1897d591f70" in words
    assert "sparkfold-tensorfold:v0.6.0-recipe is left as it was" in words
    calls = (tmp_path / "calls.jsonl").read_text()
    assert '"pull"' in calls and '"tag"' not in calls

    check = pull(tmp_path, "a1897d591f70", "a1897d591f70", "--check")
    assert check.returncode == 0 and json.loads(check.stdout)["changed"] is True
    assert (tmp_path / "calls.jsonl").read_text().count('"pull"') == 1, "a check pulls nothing"

    accepted = pull(tmp_path, "a1897d591f70", "a1897d591f70")
    assert accepted.returncode == 0, accepted.stderr
    assert json.loads(accepted.stdout)["changed"] is True
    again = pull(tmp_path, "a1897d591f70", "a1897d591f70")
    assert json.loads(again.stdout)["changed"] is False, "already that image: nothing pulled"


def test_a_published_digest_the_registry_lacks_stops_naming_the_digest_and_the_label(tmp_path: Path) -> None:
    refused = pull(tmp_path, "a1897d591f70", "a1897d591f70", FAKE_DOCKER_PULL_FAIL="1")
    assert refused.returncode == 1
    words = " ".join(refused.stderr.split())
    assert f"docker pull {REF} failed: Error response from daemon: manifest for {REF} not found" in words
    assert f"No image with digest sha256:{'bc34' * 16} (to be accepted with tf.patches=a1897d591f70)" in words
    assert "sparkfold-tensorfold:v0.6.0-recipe is left as it was" in words
    assert '"tag"' not in (tmp_path / "calls.jsonl").read_text()
