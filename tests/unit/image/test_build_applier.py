"""The applier the image build runs (roles/sparkfold_image/files/apply_series.py beside a copy of
sparkfold's patches module, exactly as the build context holds them), on the patch fixture."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_patches import patches, source  # noqa: F401  (fixtures)


@pytest.fixture
def context(tmp_path: Path, repo: Path) -> Path:
    """The build context as the role lays it out: no sparkfold package, two plain files."""
    folder = tmp_path / "context"
    folder.mkdir()
    shutil.copy(repo / "runtime/sparkfold/image/patches.py", folder / "sparkfold_patches.py")
    shutil.copy(repo / "roles/sparkfold_image/files/apply_series.py", folder / "apply_series.py")
    return folder


def build_step(context: Path, series: Path, tree: Path) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-E", str(context / "apply_series.py"), str(series), str(tree)]
    return subprocess.run(argv, cwd=context, capture_output=True, text=True, check=False, timeout=60)


def test_the_build_applies_the_series_in_order(context: Path, patches: Path, source: Path) -> None:  # noqa: F811
    done = build_step(context, patches / "series", source)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "sparkfold image: 0001-window.patch: applied",
        "sparkfold image: 0002-window-again.patch: applied",
        "sparkfold image: 0003-notes.patch: applied",
        "sparkfold image: 3 patch(es) in the series",
    ]
    assert "return 1048576" in (source / "src/tensorfold/engine.py").read_text()


def test_a_conflict_fails_the_build_naming_the_patch(context: Path, patches: Path, source: Path) -> None:  # noqa: F811
    (patches / "series").write_text("0001-window.patch\n0099-stray.patch\n")
    failed = build_step(context, patches / "series", source)
    assert failed.returncode == 1
    assert "sparkfold image: the patch series does not apply: patch 0099-stray.patch" in failed.stderr


def test_the_shipped_empty_series_builds(context: Path, repo: Path, source: Path) -> None:  # noqa: F811
    done = build_step(context, repo / "patches/tensorfold/v0.6.0/series", source)
    assert done.returncode == 0 and "0 patch(es)" in done.stdout
