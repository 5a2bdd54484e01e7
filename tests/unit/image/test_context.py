"""``sparkfold image hash --context DIR``: a ready build context is hashed by its files."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from sparkfold.cli import main
from sparkfold.image.context import context_digest


def context(tmp_path: Path) -> Path:
    folder = tmp_path / "standin"
    folder.mkdir()
    (folder / "Dockerfile").write_text("FROM scratch\nADD python3.tar /\n")
    (folder / "tensorfold").write_text("#!/usr/bin/python3\n")
    (folder / "tensorfold").chmod(0o755)
    return folder


def image_hash(repo: Path, *args: str) -> dict:
    series = repo / "patches/tensorfold/v0.6.0/series"
    argv = ["image", "hash", "--json", "--series", str(series), "--ref", "v0.6.0", *args]
    done = CliRunner().invoke(main, argv)
    assert done.exit_code == 0, done.output
    return dict(json.loads(done.output))


def test_the_digest_follows_content_names_and_the_execute_bit(tmp_path: Path) -> None:
    folder = context(tmp_path)
    first = context_digest(folder)
    assert first.startswith("sha256:") and context_digest(folder) == first
    (folder / "Dockerfile").touch()  # touched, unchanged: the same image
    assert context_digest(folder) == first
    (folder / "tensorfold").chmod(0o644)
    assert context_digest(folder) != first
    (folder / "tensorfold").chmod(0o755)
    (folder / "extra.txt").write_text("x")
    assert context_digest(folder) != first


def test_image_hash_takes_a_context_instead_of_a_base(repo: Path, tmp_path: Path) -> None:
    folder = context(tmp_path)
    before = image_hash(repo, "--context", str(folder))["hash"]
    assert before != image_hash(repo, "--base", "nvcr.io/nvidia/pytorch:26.07-py3")["hash"]
    (folder / "Dockerfile").write_text("FROM scratch\n")
    assert image_hash(repo, "--context", str(folder))["hash"] != before


def test_image_hash_wants_exactly_one_of_base_and_context(repo: Path, tmp_path: Path) -> None:
    series = str(repo / "patches/tensorfold/v0.6.0/series")
    for extra in ([], ["--base", "b", "--context", str(context(tmp_path))]):
        done = CliRunner().invoke(main, ["image", "hash", "--series", series, "--ref", "v0.6.0", *extra])
        assert done.exit_code == 2 and "--base IMAGE" in done.output


def test_a_context_declares_what_its_image_supports(repo: Path, tmp_path: Path) -> None:
    folder = context(tmp_path)
    assert image_hash(repo, "--context", str(folder))["supports"] == []
    (folder / "profile.toml").write_text('image = "stand-in"\nsupports = ["peer_watch"]\n')
    assert image_hash(repo, "--context", str(folder))["supports"] == ["peer_watch"]
