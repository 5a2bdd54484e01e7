"""``sparkfold weights …`` through CliRunner: the shapes the weights role reads, and its exit codes."""

from __future__ import annotations

import hashlib
import json
import random
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from sparkfold.cli import main

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "fakes"))
from fake_hub import FakeHub, FakeRepo

COMMIT = "89abcdef0123456789abcdef0123456789abcdef"
TOKEN = "hf_cli_SeCrEt_0123456789"
FILES = {"config.json": b"{}\n", "model.safetensors": random.Random(3).randbytes(50_000)}


def run(*args: str) -> Result:
    return CliRunner().invoke(main, ["weights", *args])


@pytest.fixture
def store(tmp_path: Path) -> Path:
    root = tmp_path / "model"
    root.mkdir()
    for rel, data in FILES.items():
        (root / rel).write_bytes(data)
    return root


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "hf-home" / "token"))
    with FakeHub(FakeRepo("acme/m", FILES, commit=COMMIT, token=TOKEN)) as running:
        yield running


def test_manifest_then_verify_a_local_directory(store: Path) -> None:
    out = store.parent / "model.manifest.json"
    made = run("manifest", str(store), "--out", str(out), "--json")
    assert made.exit_code == 0, made.output
    summary = json.loads(made.stdout)
    assert summary == {
        "changed": True,
        "manifest": str(out),
        "digest": json.loads(out.read_text())["digest"],
        "files": 2,
        "total_bytes": sum(map(len, FILES.values())),
    }
    assert json.loads(run("manifest", str(store), "--out", str(out), "--json").stdout)["changed"] is False
    assert json.loads(run("manifest", str(store)).stdout) == json.loads(out.read_text())

    checked = run("verify", str(store))  # the manifest beside the directory is the default
    assert checked.exit_code == 0
    assert checked.stdout == f"{store}: 2 files match the manifest (sizes and sha256)\n"


def test_verify_failure_prints_json_then_one_line_and_exits_1(store: Path) -> None:
    run("manifest", str(store), "--out", str(store.parent / "model.manifest.json"))
    (store / "model.safetensors").write_bytes(b"0" * 50_000)

    fast = run("verify", str(store), "--sizes-only", "--json")
    assert fast.exit_code == 0 and json.loads(fast.stdout)["mode"] == "sizes"

    full = run("verify", str(store), "--json")
    assert full.exit_code == 1
    report = json.loads(full.stdout)
    assert report["ok"] is False and [m["path"] for m in report["wrong_sha256"]] == ["model.safetensors"]
    progress, error = full.stderr.splitlines()
    assert progress.startswith("verify: 48.8 KiB of 48.8 KiB (100%)")  # progress on stderr, not in the JSON
    assert error == (
        f"Error: {store} does not match its manifest (wrong sha256: model.safetensors): "
        "fetch or copy the weights again"
    )


def test_verify_without_a_manifest_says_how_to_make_one(store: Path) -> None:
    result = run("verify", str(store))
    assert result.exit_code == 1
    assert "no such manifest: write it with `sparkfold weights manifest DIR --out" in result.stderr


def test_space_counts_what_a_copy_still_needs(store: Path, tmp_path: Path) -> None:
    manifest = tmp_path / "head.manifest.json"
    run("manifest", str(store), "--out", str(manifest))
    worker = tmp_path / "worker-model"
    result = run("space", str(worker), "--manifest", str(manifest), "--json")
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)
    assert answer["need_bytes"] == sum(map(len, FILES.values())) and answer["ok"] is True
    too_much = run("space", str(worker), "--manifest", str(manifest), "--reserve-gib", "1e9")
    assert too_much.exit_code == 1 and "free space or choose another store" in too_much.stderr


def test_fetch_json_and_the_token_never_shows(hub: FakeHub, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    token_file.chmod(0o600)
    dest = tmp_path / "store" / "m"
    args = ["fetch", "--repo", "acme/m", "--revision", COMMIT, "--dest", str(dest)]
    args += ["--token-file", str(token_file), "--endpoint", hub.url, "--json"]

    first = run(*args)
    assert first.exit_code == 0, first.output
    answer = json.loads(first.stdout)
    assert answer["ok"] is True and answer["changed"] is True
    assert answer["commit"] == COMMIT and answer["manifest"] == f"{dest}.manifest.json"
    assert sorted(answer["downloaded"]) == sorted(FILES)
    assert answer["downloaded_bytes"] == answer["total_bytes"] == sum(map(len, FILES.values()))
    assert set(answer) == {
        "ok", "changed", "dry_run", "repo", "revision", "commit", "dest", "manifest", "digest", "files",
        "total_bytes", "downloaded", "downloaded_bytes", "checked", "space",
    }  # fmt: skip

    second = run(*args)
    assert json.loads(second.stdout)["changed"] is False
    assert run("verify", str(dest), "--json").exit_code == 0

    args[args.index(str(dest))] = str(tmp_path / "other")
    refused = run(*args[:-1], "--token-file", str(tmp_path / "nope"))
    assert refused.exit_code == 1
    for result in (first, second, refused):
        assert TOKEN not in result.output


def test_fetch_refuses_a_branch_in_one_line(hub: FakeHub, tmp_path: Path) -> None:
    result = run("fetch", "--repo", "acme/m", "--revision", "main", "--dest", str(tmp_path / "m"))
    assert result.exit_code == 1
    assert result.stderr.count("\n") == 1 and "--allow-moving-revision" in result.stderr


def test_fetch_with_a_pin_that_differs_says_which_file_in_one_line(hub: FakeHub, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    token_file.chmod(0o600)
    args = ["fetch", "--repo", "acme/m", "--revision", COMMIT, "--dest", str(tmp_path / "m")]
    args += ["--token-file", str(token_file), "--endpoint", hub.url]
    found = hashlib.sha256(FILES["model.safetensors"]).hexdigest()
    assert run(*args, "--pin", f"model.safetensors={found}").exit_code == 0
    refused = run(*args, "--pin", f"model.safetensors={'1' * 64}")
    assert refused.exit_code == 1 and refused.stderr.count("\n") == 1
    assert f"model.safetensors has sha256 {found}, not the pinned {'1' * 64}" in refused.stderr
    malformed = run(*args, "--pin", "model.safetensors")
    assert malformed.exit_code == 1 and "not a file pin" in malformed.stderr
