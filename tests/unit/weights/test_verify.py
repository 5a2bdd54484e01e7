"""verify: every kind of difference is found and named; sizes-only is the fast path."""

from __future__ import annotations

from pathlib import Path

from weights_fakes import model_files, write_tree

from sparkfold.weights import Manifest, build_manifest, verify_dir
from sparkfold.weights.verify import Mismatch

SHARD = "model-00001-of-00002.safetensors"


def _store(tmp_path: Path) -> tuple[Path, Manifest]:
    root = write_tree(tmp_path / "m", model_files())
    return root, build_manifest(root, interval_s=0)


def test_an_intact_store_passes(tmp_path: Path) -> None:
    root, manifest = _store(tmp_path)
    report = verify_dir(root, manifest, interval_s=0)
    assert report.ok
    assert report.message().endswith("4 files match the manifest (sizes and sha256)")


def test_a_corrupted_byte_is_named(tmp_path: Path) -> None:
    root, manifest = _store(tmp_path)
    data = bytearray((root / SHARD).read_bytes())
    data[1000] ^= 0xFF
    (root / SHARD).write_bytes(bytes(data))

    report = verify_dir(root, manifest, interval_s=0)

    assert not report.ok
    assert [m.path for m in report.wrong_sha256] == [SHARD]
    assert f"wrong sha256: {SHARD}" in report.message()
    assert report.message().endswith(": fetch or copy the weights again")
    assert report.bad_paths() == [SHARD]
    # the fast path cannot see a same-size corruption; that is what it trades for speed
    assert verify_dir(root, manifest, sizes_only=True).ok


def test_missing_extra_and_wrong_size_are_each_named(tmp_path: Path) -> None:
    root, manifest = _store(tmp_path)
    (root / "config.json").unlink()
    (root / "tokenizer_config.json").write_bytes(b"{}")
    (root / "stray.bin").write_bytes(b"left over")

    for sizes_only in (True, False):
        report = verify_dir(root, manifest, sizes_only=sizes_only, interval_s=0)
        assert report.missing == ["config.json"]
        assert report.extra == ["stray.bin"]
        expected = len(model_files()["tokenizer_config.json"])
        assert report.wrong_size == [Mismatch("tokenizer_config.json", expected, 2)]
        assert report.message() == (
            f"{root} does not match its manifest (missing: config.json; wrong size: tokenizer_config.json; "
            "not in the manifest: stray.bin): fetch or copy the weights again and remove the files not in "
            "the manifest"
        )


def test_json_shape(tmp_path: Path) -> None:
    root, manifest = _store(tmp_path)
    (root / "config.json").unlink()
    data = verify_dir(root, manifest, sizes_only=True).to_json()
    assert data == {
        "ok": False,
        "dir": str(root),
        "mode": "sizes",
        "repo": None,
        "revision": None,
        "digest": manifest.digest,
        "files": 4,
        "total_bytes": manifest.total_bytes,
        "missing": ["config.json"],
        "extra": [],
        "wrong_size": [],
        "wrong_sha256": [],
    }


def test_many_differences_are_counted_not_all_listed_in_the_line(tmp_path: Path) -> None:
    files = {f"f{i:02d}": bytes([i]) for i in range(8)}
    root = write_tree(tmp_path / "m", files)
    manifest = build_manifest(root, interval_s=0)
    for name in files:
        (root / name).unlink()
    message = verify_dir(root, manifest).message()
    assert "missing: f00, f01, f02, f03, f04 and 3 more" in message
