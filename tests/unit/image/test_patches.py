"""The patch series mechanism on a fixture: a small git repository made here, tagged like the pin.

Patches 0001 and 0002 touch the same lines (0002 only applies on top of 0001), 0003 adds a file,
and a stray patch made against other content conflicts.
"""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

from sparkfold.image.patches import (
    PatchConflict,
    SeriesError,
    apply_series,
    hash_of,
    read_series,
    series_hash,
)

ORIGINAL = "def window():\n    return 2051\n\n\ndef drafts():\n    return 'auto'\n"


def git(cwd: Path, *args: str) -> str:
    command = ["git", "-c", "user.name=test", "-c", "user.email=test@example.invalid", *args]
    return subprocess.run(command, cwd=cwd, check=True, capture_output=True, text=True).stdout


def diff_of(tree: Path, change: dict[str, str]) -> str:
    """The patch that takes the tree's current content to ``change`` (then puts it back)."""
    for name, text in change.items():
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_text(text)
    git(tree, "add", "-A")
    patch = git(tree, "diff", "--cached")
    git(tree, "reset", "-q", "--hard")
    return patch


def snapshot(tree: Path) -> str:
    """A fingerprint of every file in the tree (outside .git)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in tree.rglob("*") if p.is_file() and ".git" not in p.parts):
        digest.update(str(path.relative_to(tree)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


@pytest.fixture
def source(tmp_path: Path) -> Path:
    tree = tmp_path / "TensorFold"
    (tree / "src/tensorfold").mkdir(parents=True)
    git(tree, "init", "-q")
    (tree / "src/tensorfold/engine.py").write_text(ORIGINAL)
    git(tree, "add", "-A")
    git(tree, "commit", "-qm", "v0.6.0")
    git(tree, "tag", "v0.6.0")
    return tree


@pytest.fixture
def patches(tmp_path: Path, source: Path) -> Path:
    folder = tmp_path / "patches/tensorfold/v0.6.0"
    folder.mkdir(parents=True)
    engine = "src/tensorfold/engine.py"
    one = ORIGINAL.replace("2051", "196608")
    (folder / "0001-window.patch").write_text(diff_of(source, {engine: one}))
    # 0002 is made on top of 0001: it needs 0001 first
    (source / engine).write_text(one)
    git(source, "commit", "-qam", "tmp")
    (folder / "0002-window-again.patch").write_text(
        diff_of(source, {engine: one.replace("196608", "1048576")})
    )
    git(source, "reset", "-q", "--hard", "v0.6.0")
    (folder / "0003-notes.patch").write_text(diff_of(source, {"src/tensorfold/notes.txt": "patched\n"}))
    (folder / "0099-stray.patch").write_text(diff_of(source, {engine: ORIGINAL.replace("'auto'", "'none'")}))
    # the stray patch now meets other content: make its context disagree with the pinned source
    stray = (folder / "0099-stray.patch").read_text().replace("def drafts():", "def drafters():")
    (folder / "0099-stray.patch").write_text(stray)
    (folder / "series").write_text(
        "# series for the test\n0001-window.patch\n\n"
        "0002-window-again.patch   # on top of 0001\n0003-notes.patch\n"
    )
    return folder


def test_series_applies_in_order(source: Path, patches: Path) -> None:
    steps = apply_series(read_series(patches / "series"), source)
    assert [(s.name, s.state) for s in steps] == [
        ("0001-window.patch", "applied"),
        ("0002-window-again.patch", "applied"),
        ("0003-notes.patch", "applied"),
    ]
    assert "return 1048576" in (source / "src/tensorfold/engine.py").read_text()
    assert (source / "src/tensorfold/notes.txt").read_text() == "patched\n"


def test_reapplying_is_a_no_op(source: Path, patches: Path) -> None:
    series = read_series(patches / "series")
    apply_series(series, source)
    before = snapshot(source)
    steps = apply_series(series, source)
    assert {s.state for s in steps} == {"already applied"}
    assert snapshot(source) == before


def test_a_partly_applied_tree_gets_the_rest(source: Path, patches: Path) -> None:
    (patches / "first").write_text("0001-window.patch\n")
    apply_series(read_series(patches / "first"), source)
    steps = apply_series(read_series(patches / "series"), source)
    assert [s.state for s in steps] == ["already applied", "applied", "applied"]


def test_a_conflicting_patch_is_named_and_the_tree_is_unchanged(source: Path, patches: Path) -> None:
    (patches / "series").write_text("0001-window.patch\n0003-notes.patch\n0099-stray.patch\n")
    before = snapshot(source)
    with pytest.raises(
        PatchConflict, match=r"patch 0099-stray.patch does not apply to .*the tree is unchanged"
    ):
        apply_series(read_series(patches / "series"), source)
    assert snapshot(source) == before  # 0001 and 0003 were applied, then reversed
    assert git(source, "status", "--porcelain") == ""


def test_order_matters(source: Path, patches: Path) -> None:
    (patches / "series").write_text("0002-window-again.patch\n0001-window.patch\n")
    with pytest.raises(PatchConflict) as failure:
        apply_series(read_series(patches / "series"), source)
    assert failure.value.patch == "0002-window-again.patch"


def test_strip_level_and_a_tree_inside_a_repository(source: Path, patches: Path) -> None:
    # the reference recipe's patches are -p0 paths inside site-packages (tensorfold/...), which is
    # src/ of a checkout: apply there, although src/ sits inside the checkout's repository
    p0 = (patches / "0001-window.patch").read_text().replace("a/src/", "").replace("b/src/", "")
    (patches / "0001-p0.patch").write_text(p0)
    (patches / "series").write_text("0001-p0.patch -p0\n")
    series = read_series(patches / "series")
    assert series.patches[0].strip == 0
    assert [s.state for s in apply_series(series, source / "src")] == ["applied"]
    assert "return 196608" in (source / "src/tensorfold/engine.py").read_text()


def test_hash_follows_content_not_comments(source: Path, patches: Path) -> None:
    def label() -> str:
        return hash_of(
            read_series(patches / "series"),
            base="nvcr.io/nvidia/pytorch:26.07-py3",
            ref="v0.6.0",
            extras=["av==18.1.0", "xgrammar>=0.2.8,<0.3"],
        )

    first = label()
    assert first == label() and len(first) == 64
    series = patches / "series"
    series.write_text(series.read_text() + "# a new comment changes nothing\n")
    assert label() == first
    patch = patches / "0003-notes.patch"
    patch.write_text(patch.read_text().replace("+patched", "+patched twice"))
    assert label() != first

    entries = [("0001-a.patch", 1, "aa"), ("0002-b.patch", 1, "bb")]
    common = {"base": "base", "ref": "v0.6.0", "extras": ["av==18.1.0"]}
    plain = series_hash(patches=entries, **common)  # type: ignore[arg-type]
    assert series_hash(patches=entries[::-1], **common) != plain  # type: ignore[arg-type]
    assert series_hash(patches=[("0001-a.patch", 0, "aa"), entries[1]], **common) != plain  # type: ignore[arg-type]
    for key, value in (("base", "other"), ("ref", "v0.6.6"), ("extras", ["av==18.2.0"])):
        assert series_hash(patches=entries, **(common | {key: value})) != plain  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0001-missing.patch\n", "0001-missing.patch is listed but"),
        ("0001-window.patch\n0001-window.patch\n", "0001-window.patch is listed twice"),
        ("../escape.patch\n", "not a patch entry"),
        ("0001-window.patch -x\n", "not a patch entry"),
    ],
)
def test_a_bad_series_names_its_line(patches: Path, text: str, message: str) -> None:
    (patches / "series").write_text(text)
    with pytest.raises(SeriesError, match=message):
        read_series(patches / "series")


def test_the_shipped_series_is_empty(repo: Path) -> None:
    # no patch ships without a test that applies it to the pinned source
    series = read_series(repo / "patches/tensorfold/v0.6.0/series")
    assert series.patches == ()


def test_without_git_the_error_says_so(
    source: Path, patches: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from sparkfold.image.patches import PatchError

    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(PatchError, match="git is needed"):
        apply_series(read_series(patches / "series"), source)
