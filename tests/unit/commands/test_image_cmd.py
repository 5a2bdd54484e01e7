"""``sparkfold image hash|apply`` through CliRunner, on the shipped series and a tiny tree."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from sparkfold.cli import main

BASE = ["--base", "nvcr.io/nvidia/pytorch:26.07-py3", "--ref", "v0.6.0"]


def test_hash_of_the_shipped_series(repo: Path) -> None:
    series = str(repo / "patches/tensorfold/v0.6.0/series")
    runner = CliRunner()
    plain = runner.invoke(main, ["image", "hash", "--series", series, *BASE, "--extra", "av==18.1.0"])
    assert plain.exit_code == 0, plain.output
    digest = plain.output.strip()
    assert len(digest) == 64
    as_json = runner.invoke(
        main, ["image", "hash", "--series", series, *BASE, "--extra", "av==18.1.0", "--json"]
    )
    assert json.loads(as_json.output) == {
        "hash": digest,
        "label": "org.sparkfold.tensorfold.series",
        "patches": [],
        "supports": [],  # patches/tensorfold/v0.6.0/profile.toml: stock, nothing
    }
    other = runner.invoke(main, ["image", "hash", "--series", series, *BASE, "--extra", "av==18.2.0"])
    assert other.output.strip() != digest


def test_apply_then_reapply_then_conflict(tmp_path: Path) -> None:
    tree = tmp_path / "src"
    tree.mkdir()
    (tree / "a.txt").write_text("one\n")
    (tmp_path / "0001-two.patch").write_text("--- a/a.txt\n+++ b/a.txt\n@@ -1 +1 @@\n-one\n+two\n")
    (tmp_path / "0002-three.patch").write_text("--- a/a.txt\n+++ b/a.txt\n@@ -1 +1 @@\n-zero\n+three\n")
    series = tmp_path / "series"
    series.write_text("0001-two.patch\n")
    runner = CliRunner()
    args = ["image", "apply", "--series", str(series), "--tree", str(tree)]
    first = runner.invoke(main, args)
    assert first.exit_code == 0, first.output
    assert "0001-two.patch: applied" in first.output and (tree / "a.txt").read_text() == "two\n"
    again = runner.invoke(main, [*args, "--json"])
    assert json.loads(again.output)["changed"] is False

    series.write_text("0001-two.patch\n0002-three.patch\n")
    failed = runner.invoke(main, args)
    assert failed.exit_code == 1
    assert "patch 0002-three.patch does not apply" in failed.output
    assert (tree / "a.txt").read_text() == "two\n"


def test_a_missing_series_is_one_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["image", "hash", "--series", str(tmp_path / "nope"), *BASE])
    assert result.exit_code == 1
    assert "cannot read" in result.output
