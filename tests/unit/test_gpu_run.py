"""tests/gpu/run.sh names the tree it runs, and with EXPECT_SOURCE refuses another one before it
spends a GPU's time: a copy of the checkout made before the last commit runs the older code."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

RUN_SH = Path(__file__).resolve().parents[1] / "gpu" / "run.sh"


def _run(tree: Path, **env: str) -> tuple[int, str]:
    out = tree / "out"
    proc = subprocess.run(
        ["bash", str(RUN_SH), str(out)],
        cwd=tree,
        env={
            "PATH": os.environ["PATH"],
            "WORK": str(tree / "work"),
            "STEPS": "none",
            "GIT_CEILING_DIRECTORIES": str(tree.parent),  # no checkout above the copy
            **env,
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    return proc.returncode, (out / "run.log").read_text()


def test_a_copy_of_another_commit_is_refused(tmp_path: Path) -> None:
    (tmp_path / ".source").write_text("8ba6b9c0aa11\n")
    rc, log = _run(tmp_path, EXPECT_SOURCE="5f7ff36bb022")
    assert rc == 2, log
    assert "source: 8ba6b9c0aa11" in log
    assert "this tree is 8ba6b9c0aa11, not EXPECT_SOURCE=5f7ff36bb022" in log
    assert "device:" not in log  # refused before anything else ran


def test_a_copy_that_names_no_source_is_refused(tmp_path: Path) -> None:
    rc, log = _run(tmp_path, EXPECT_SOURCE="5f7ff36bb022")
    assert rc == 2, log
    assert "this tree is unknown" in log


def test_the_expected_source_goes_on(tmp_path: Path) -> None:
    (tmp_path / ".source").write_text("8ba6b9c0aa11\n")
    rc, log = _run(tmp_path, EXPECT_SOURCE="8ba6b9c0aa11")
    assert "source: 8ba6b9c0aa11" in log
    assert "not EXPECT_SOURCE" not in log
    assert "device:" in log, (rc, log)
