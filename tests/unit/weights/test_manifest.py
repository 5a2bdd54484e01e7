"""Manifests of a local directory (the `dir` source): contents, determinism, refusal of bad files."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from weights_fakes import model_files, write_tree

from sparkfold.weights import (
    ManifestError,
    build_manifest,
    default_manifest_path,
    read_manifest,
    write_manifest,
)
from sparkfold.weights.manifest import list_files


def test_manifest_lists_every_model_file_with_size_and_sha256(tmp_path: Path) -> None:
    files = model_files()
    root = write_tree(tmp_path / "model", files)
    write_tree(root, {".cache/huggingface/download/config.json.metadata": b"x", "a/.rsync-partial/b": b"y"})

    manifest = build_manifest(root, interval_s=0)

    assert [f.path for f in manifest.files] == sorted(files, key=str.encode)
    for entry in manifest.files:
        assert entry.size == len(files[entry.path])
        assert entry.sha256 == hashlib.sha256(files[entry.path]).hexdigest()
    assert manifest.total_bytes == sum(map(len, files.values()))
    assert (manifest.repo, manifest.revision) == (None, None)


def test_paths_sort_in_byte_order_like_c_locale(tmp_path: Path) -> None:
    root = write_tree(tmp_path / "m", {"b": b"1", "B": b"2", "a/z": b"3", "a-b": b"4"})
    assert list(list_files(root)) == ["B", "a-b", "a/z", "b"]


def test_same_files_same_bytes_and_digest(tmp_path: Path) -> None:
    one = build_manifest(
        write_tree(tmp_path / "one", model_files()), repo="acme/x", revision="r", interval_s=0
    )
    two = build_manifest(
        write_tree(tmp_path / "two", model_files()), repo="acme/x", revision="r", interval_s=0
    )
    assert one.to_json() == two.to_json()
    changed = dict(model_files(), **{"config.json": b"{}"})
    three = build_manifest(write_tree(tmp_path / "three", changed), interval_s=0)
    assert three.digest != one.digest


def test_write_is_atomic_and_skips_unchanged_content(tmp_path: Path) -> None:
    manifest = build_manifest(write_tree(tmp_path / "m", model_files()), interval_s=0)
    out = default_manifest_path(tmp_path / "m/")
    assert out == tmp_path / "m.manifest.json"
    assert write_manifest(manifest, out) is True
    assert write_manifest(manifest, out) is False
    assert read_manifest(out) == manifest
    assert [p.name for p in tmp_path.iterdir() if p.is_file()] == ["m.manifest.json"]


def _tamper(path: Path, edit: dict[str, object]) -> None:
    data = json.loads(path.read_text())
    data.update(edit)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        ({"total_bytes": 1}, "total_bytes is not the sum"),
        ({"digest": "0" * 64}, "digest does not match"),
        ({"format": "something-else"}, "not a sparkfold-weights-manifest file"),
        ({"files": [{"path": "../etc/passwd", "size": 1, "sha256": "0" * 64}]}, "stay inside the directory"),
        ({"files": [{"path": "a", "size": 1, "sha256": "XYZ"}]}, "64 lowercase hex"),
    ],
)
def test_a_tampered_manifest_is_refused_with_the_field(
    tmp_path: Path, edit: dict[str, object], says: str
) -> None:
    out = tmp_path / "m.manifest.json"
    write_manifest(build_manifest(write_tree(tmp_path / "m", model_files()), interval_s=0), out)
    _tamper(out, edit)
    with pytest.raises(ManifestError, match=says):
        read_manifest(out)


def test_missing_or_broken_manifest_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match=r"no such manifest: write it with `sparkfold weights manifest"):
        read_manifest(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ManifestError, match="not JSON"):
        read_manifest(tmp_path / "bad.json")


def test_a_missing_directory_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match="is not a directory"):
        build_manifest(tmp_path / "absent")
