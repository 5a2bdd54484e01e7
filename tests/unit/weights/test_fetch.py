"""fetch against a fake Hugging Face Hub on loopback: no network beyond 127.0.0.1."""

from __future__ import annotations

import fcntl
import hashlib
import os
from pathlib import Path

import pytest
from fake_hub import FakeHub, FakeRepo
from weights_fakes import COMMIT, model_files

from sparkfold.units import GIB
from sparkfold.weights import (
    DiskSpaceError,
    HubError,
    PinError,
    RevisionError,
    TokenFileError,
    read_manifest,
    verify_dir,
)
from sparkfold.weights.fetch import fetch
from sparkfold.weights.verify import parse_pins

SHARD = "model-00001-of-00002.safetensors"
REPO = "acme/tiny-glm"
TOKEN = "hf_sEcReT0123456789abcdefTOKEN"


def _fetch(hub: FakeHub, dest: Path, revision: str = COMMIT, **kwargs: object) -> object:
    kwargs.setdefault("interval_s", 0)
    return fetch(REPO, revision, dest, endpoint=hub.url, **kwargs)  # type: ignore[arg-type]


def test_a_pinned_revision_lands_with_the_hubs_manifest(hub: FakeHub, tmp_path: Path) -> None:
    dest = tmp_path / "store" / "tiny-glm"

    result = _fetch(hub, dest)

    files = model_files()
    assert result.changed and sorted(result.downloaded) == sorted(files)  # type: ignore[attr-defined]
    for rel, data in files.items():
        assert (dest / rel).read_bytes() == data
    manifest = read_manifest(tmp_path / "store" / "tiny-glm.manifest.json")
    assert (manifest.repo, manifest.revision) == (REPO, COMMIT)
    assert {f.path: f.sha256 for f in manifest.files} == {
        rel: hashlib.sha256(data).hexdigest() for rel, data in files.items()
    }
    assert verify_dir(dest, manifest).ok


def test_a_complete_store_is_not_fetched_again_nor_the_hub_asked(hub: FakeHub, tmp_path: Path) -> None:
    _fetch(hub, tmp_path / "m")
    before = len(hub.requests)
    again = _fetch(hub, tmp_path / "m")
    assert not again.changed  # type: ignore[attr-defined]
    assert len(hub.requests) == before


def test_offline_a_complete_store_verifies_and_an_incomplete_one_says_what_to_do(
    hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from huggingface_hub import constants

    _fetch(hub, tmp_path / "m")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert not _fetch(hub, tmp_path / "m", recheck="sha256").changed  # type: ignore[attr-defined]
    with pytest.raises(HubError, match=r"HF_HUB_OFFLINE is set and .* does not hold this revision"):
        _fetch(hub, tmp_path / "other")


def test_a_corrupted_file_is_named_then_only_it_is_fetched_again(hub: FakeHub, tmp_path: Path) -> None:
    dest = tmp_path / "m"
    _fetch(hub, dest)
    data = bytearray((dest / SHARD).read_bytes())
    data[5] ^= 1
    (dest / SHARD).write_bytes(bytes(data))
    manifest = read_manifest(tmp_path / "m.manifest.json")
    assert [m.path for m in verify_dir(dest, manifest).wrong_sha256] == [SHARD]

    warnings: list[str] = []
    before = len(hub.requests)
    repaired = _fetch(hub, dest, recheck="sha256", warn=warnings.append)

    assert repaired.downloaded == [SHARD]  # type: ignore[attr-defined]
    assert any(f"wrong sha256: {SHARD}" in w for w in warnings)
    assert [r for r in hub.requests[before:] if r[0] == "GET" and "/cdn/" in r[1]] == hub.downloads(SHARD)[
        -1:
    ]
    assert verify_dir(dest, manifest).ok


def test_a_transfer_cut_midway_resumes_with_a_range_request(hub: FakeHub, tmp_path: Path) -> None:
    hub.cut_once[SHARD] = 100_000

    _fetch(hub, tmp_path / "m")

    gets = hub.downloads(SHARD)
    assert len(gets) == 2
    assert gets[0][2] is None
    start = int((gets[1][2] or "").removeprefix("bytes=").split("-")[0])
    assert 0 < start <= 100_000
    assert (tmp_path / "m" / SHARD).read_bytes() == model_files()[SHARD]


def test_a_failed_run_keeps_finished_files_and_the_rerun_fetches_only_the_rest(
    hub: FakeHub, tmp_path: Path
) -> None:
    late = "shards/model-00002-of-00002.safetensors"
    hub.fail_get.add(late)
    with pytest.raises(HubError, match="answered HTTP 500: try again later"):
        _fetch(hub, tmp_path / "m")
    assert not (tmp_path / "m.manifest.json").exists()

    hub.fail_get.clear()
    before = {rel: len(hub.downloads(rel)) for rel in model_files()}
    result = _fetch(hub, tmp_path / "m")

    fetched_again = [rel for rel in model_files() if len(hub.downloads(rel)) > before[rel]]
    # files are fetched in sorted order: the two before the failure stay, the rest come now
    assert sorted(fetched_again) == sorted(result.downloaded) == [late, "tokenizer_config.json"]  # type: ignore[attr-defined]


def test_the_disk_check_counts_only_what_is_missing(hub: FakeHub, tmp_path: Path) -> None:
    dest = tmp_path / "m"
    files = model_files()
    missing = len(files[SHARD])
    _fetch(hub, dest)
    (dest / SHARD).unlink()
    os.remove(tmp_path / "m.manifest.json")

    with pytest.raises(DiskSpaceError) as caught:
        _fetch(hub, dest, reserve_gib=1, free=lambda _: GIB + missing - 1)
    assert str(caught.value) == (
        f"{dest}: need 293.0 KiB more (and 1.0 GiB kept free), 1.0 GiB free: "
        "free space or choose another store"
    )
    assert not (dest / SHARD).exists()
    assert _fetch(hub, dest, reserve_gib=1, free=lambda _: GIB + missing).downloaded == [SHARD]  # type: ignore[attr-defined]


def test_a_branch_is_refused_unless_allowed_and_then_pinned(hub: FakeHub, tmp_path: Path) -> None:
    with pytest.raises(
        RevisionError, match="revision 'main' is a branch or tag, not a commit: pin the 40-hex"
    ):
        _fetch(hub, tmp_path / "m", revision="main")
    assert hub.requests == []

    result = _fetch(hub, tmp_path / "m", revision="main", allow_moving_revision=True)
    assert result.commit == COMMIT  # type: ignore[attr-defined]
    assert read_manifest(tmp_path / "m.manifest.json").revision == COMMIT


def test_an_unknown_commit_or_repo_says_so(hub: FakeHub, tmp_path: Path) -> None:
    with pytest.raises(RevisionError, match=f"{REPO} has no revision '{'f' * 40}'"):
        _fetch(hub, tmp_path / "m", revision="f" * 40)
    with pytest.raises(HubError, match="acme/absent not found on"):
        fetch("acme/absent", COMMIT, tmp_path / "m", endpoint=hub.url)


def test_a_gated_repo_needs_the_token_which_never_leaves_the_hub_or_shows(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    gated = FakeRepo(REPO, model_files(), commit=COMMIT, token=TOKEN)
    token_file = tmp_path / "hf-token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    with FakeHub(gated) as hub:
        with pytest.raises(HubError, match=f"{REPO} is gated: accept its terms"):
            _fetch(hub, tmp_path / "m")
        warnings: list[str] = []
        result = _fetch(hub, tmp_path / "m", token_file=token_file, warn=warnings.append)

    assert result.changed and warnings == []  # type: ignore[attr-defined]
    sent = {(path.startswith("/cdn/"), auth) for _, path, _, auth in hub.requests if auth}
    assert sent == {(False, f"Bearer {TOKEN}")}  # the Hub got it; the CDN never did
    out, err = capfd.readouterr()
    assert TOKEN not in out + err + repr(result.to_json())  # type: ignore[attr-defined]


def test_a_wrong_token_is_refused_without_showing_it(tmp_path: Path) -> None:
    gated = FakeRepo(REPO, model_files(), commit=COMMIT, token=TOKEN)
    token_file = tmp_path / "hf-token"
    token_file.write_text("hf_wrong_one")
    token_file.chmod(0o600)
    with FakeHub(gated) as hub, pytest.raises(HubError) as caught:
        _fetch(hub, tmp_path / "m", token_file=token_file)
    assert (
        str(caught.value)
        == f"Hugging Face does not accept the token in {token_file}: write a valid read token there"
    )


def test_token_file_problems(hub: FakeHub, tmp_path: Path) -> None:
    with pytest.raises(TokenFileError, match="no such token file"):
        _fetch(hub, tmp_path / "m", token_file=tmp_path / "absent")
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(TokenFileError, match="the token file is empty"):
        _fetch(hub, tmp_path / "m", token_file=empty)
    loose = tmp_path / "loose"
    loose.write_text(TOKEN)
    loose.chmod(0o644)
    warnings: list[str] = []
    _fetch(hub, tmp_path / "m", token_file=loose, warn=warnings.append)
    assert warnings == [f"warning: {loose} is readable by others (mode 0644): chmod 600 {loose}"]


def test_an_endpoint_that_is_not_a_hub_says_so(hub: FakeHub, tmp_path: Path) -> None:
    hub.plain_resolve.add("config.json")  # no X-Repo-Commit: huggingface_hub reports "not in the local cache"
    with pytest.raises(
        HubError, match=r"answered without file metadata: is HF_ENDPOINT a Hugging Face Hub\?"
    ):
        _fetch(hub, tmp_path / "m")


def test_an_unreachable_hub_says_so(tmp_path: Path) -> None:
    with FakeHub() as gone:
        url = gone.url
    with pytest.raises(
        HubError, match=r"cannot reach http://127\.0\.0\.1:\d+ \(\w+\): check the node's network"
    ):
        fetch(REPO, COMMIT, tmp_path / "m", endpoint=url)


def test_leftovers_in_the_store_are_named_before_any_download(hub: FakeHub, tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "old-shard.safetensors").write_bytes(b"from another revision")
    with pytest.raises(
        HubError, match=r"holds files that are not in .* \(old-shard\.safetensors\): remove them"
    ):
        _fetch(hub, tmp_path / "m")
    assert not any(r[0] == "GET" and "/api/" not in r[1] for r in hub.requests)


def test_a_moving_revision_already_in_place_is_not_hashed_again(hub: FakeHub, tmp_path: Path) -> None:
    _fetch(hub, tmp_path / "m", revision="main", allow_moving_revision=True)
    again = _fetch(hub, tmp_path / "m", revision="main", allow_moving_revision=True)
    assert not again.changed and again.checked == "sizes"  # type: ignore[attr-defined]
    assert [r[1] for r in hub.requests].count(f"/api/models/{REPO}/revision/main") == 2


def test_one_fetch_at_a_time_and_a_killed_runs_partial_files_are_cleared(
    hub: FakeHub, tmp_path: Path
) -> None:
    dest = tmp_path / "m"
    partial = dest / ".cache/huggingface/download/abc.0123.deadbeef.incomplete"
    partial.parent.mkdir(parents=True)
    partial.write_bytes(b"x" * 1000)
    fd = os.open(dest, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with pytest.raises(HubError, match="another fetch is writing here: wait for it to finish"):
            _fetch(hub, dest)
    finally:
        os.close(fd)
    _fetch(hub, dest)
    assert not partial.exists()


def test_a_dry_run_plans_and_writes_nothing(hub: FakeHub, tmp_path: Path) -> None:
    dest = tmp_path / "m"
    plan = _fetch(hub, dest, dry_run=True)
    assert plan.changed and plan.dry_run  # type: ignore[attr-defined]
    assert sorted(plan.downloaded) == sorted(model_files())  # type: ignore[attr-defined]
    assert plan.downloaded_bytes == sum(map(len, model_files().values()))  # type: ignore[attr-defined]
    assert plan.to_json()["digest"] is None  # type: ignore[attr-defined]
    assert not dest.exists() and not (tmp_path / "m.manifest.json").exists()
    assert [r[1] for r in hub.requests] == [f"/api/models/{REPO}/revision/{COMMIT}"]

    _fetch(hub, dest)
    assert not _fetch(hub, dest, dry_run=True).changed  # type: ignore[attr-defined]


def test_pinned_files_are_accepted_and_one_that_differs_refuses_the_store_naming_it(
    hub: FakeHub, tmp_path: Path
) -> None:
    """Peers got other bytes from the same repository: a file whose sha256 is not its pin stops the
    fetch, naming the file, the pinned and the found digest, and no manifest is written."""
    files = model_files()
    pins = {path: hashlib.sha256(data).hexdigest() for path, data in files.items()}
    accepted = _fetch(hub, tmp_path / "m", pins={SHARD: pins[SHARD]})
    assert accepted.manifest_written  # type: ignore[attr-defined]

    other = {**pins, SHARD: "0" * 64}
    with pytest.raises(PinError) as refused:
        _fetch(hub, tmp_path / "n", pins=other)
    said = str(refused.value)
    assert f"{tmp_path / 'n'} is refused and nothing is served from it" in said
    assert f"{SHARD} has sha256 {pins[SHARD]}, not the pinned {'0' * 64}" in said
    assert "config.json" not in said  # the files that match are not named
    assert not (tmp_path / "n.manifest.json").exists()

    with pytest.raises(PinError, match=f"{SHARD} has sha256 {pins[SHARD]}, not the pinned"):
        _fetch(hub, tmp_path / "m", pins=other)  # a store already in place is held to them too
    with pytest.raises(PinError, match=r"extra.bin is pinned \(0{64}\) but not in acme/tiny-glm@"):
        _fetch(hub, tmp_path / "m", pins={"extra.bin": "0" * 64})


def test_a_malformed_pin_is_refused_in_words() -> None:
    assert parse_pins([f"a/b.json={'ab' * 32}"]) == {"a/b.json": "ab" * 32}
    with pytest.raises(PinError, match=r"not a file pin \(PATH=<64 lowercase hex sha256>\): 'config.json=X'"):
        parse_pins(["config.json=X"])
