"""An external patch series by reference: a git repository, a commit, a folder, ordered files and
their sha256 digests, fetched and verified before anything is applied.

:func:`fetch_series` is what the image role runs on the head (``sparkfold image fetch``):

1. the commit is fetched into ``<dest>/checkout`` (a git repository of its own; nothing is fetched
   again when it already holds the commit), and must be exactly that commit: a commit, not a tag,
   so it cannot move;
2. every listed file is read from the commit's tree (``git show``, so a stray edit of the working
   copy is never used) and its sha256 compared with the pinned digest; a file whose digest differs
   stops everything with :class:`DigestMismatch`, naming it and both digests;
3. the verified bytes are written to ``<dest>/series/`` with a quilt ``series`` file listing them in
   order at the series' strip level, ready for :func:`sparkfold.image.patches.apply_series`.

With no files listed, every ``*.patch`` file of the folder is taken, in byte order of its name (as
the recipe's ``patches/*.patch`` glob in the C locale), and their digests are returned for the
operator to pin (trust on first use; the role records them beside the TensorFold commit pin).

Hand-written over ``subprocess`` + ``git``: no library fetches one commit of a repository by SHA
and reads blobs from it with less code than git's own commands.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sparkfold.image.patches import PatchError

__all__ = ["DigestMismatch", "FetchError", "Fetched", "SeriesFile", "fetch_series", "parse_file_pin"]

_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")
GIT_TIMEOUT_S = 1800


class FetchError(PatchError):
    """The series cannot be fetched (no such commit, repository unreachable, file missing)."""


class DigestMismatch(FetchError):
    """A fetched file is not the pinned one."""

    def __init__(self, name: str, expected: str, found: str, source: str) -> None:
        self.name = name
        super().__init__(
            f"{name} of {source} has sha256 {found}, not the pinned {expected}: the series is refused and "
            "nothing was applied. If the change is intended, review it and pin the new digest "
            "(sparkfold_image_series_ref.files)"
        )


@dataclass(frozen=True)
class SeriesFile:
    name: str
    sha256: str | None = None
    """The pinned digest; None = not pinned yet (trust on first use)."""


@dataclass(frozen=True)
class Fetched:
    commit: str
    folder: str
    series: Path
    files: tuple[SeriesFile, ...]
    fetched: bool
    """True when the commit was downloaded now (False: the checkout already had it)."""
    unpinned: tuple[str, ...]
    """Files whose digest was not given (trust on first use: pin them)."""


def parse_file_pin(text: str) -> SeriesFile:
    """``NAME=SHA256`` or plain ``NAME`` (not pinned yet)."""
    name, _, digest = text.partition("=")
    if not _NAME.match(name) or (digest and not re.fullmatch(r"[0-9a-f]{64}", digest)):
        raise FetchError(f"not a series file entry (NAME or NAME=<64 hex sha256>): {text!r}")
    return SeriesFile(name, digest or None)


def _git(cwd: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[bytes]:
    env = os.environ | {"GIT_TERMINAL_PROMPT": "0", "GIT_CEILING_DIRECTORIES": str(cwd.parent)}
    try:
        done = subprocess.run(
            ["git", *args], cwd=cwd, env=env, capture_output=True, timeout=GIT_TIMEOUT_S, check=False
        )
    except FileNotFoundError:
        raise FetchError("git is needed to fetch the patch series: install git on this host") from None
    except subprocess.TimeoutExpired:
        raise FetchError(f"git {args[0]} took longer than {GIT_TIMEOUT_S} s") from None
    if check and done.returncode != 0:
        detail = done.stderr.decode(errors="replace").strip().splitlines()
        raise FetchError(f"git {' '.join(args[:2])} failed: {detail[-1] if detail else 'no message'}")
    return done


def _checkout(repo: str, commit: str, where: Path) -> bool:
    """Make ``where`` a repository holding ``commit``; True when it had to be fetched."""
    where.mkdir(parents=True, exist_ok=True)
    if not (where / ".git").exists():
        _git(where, "init", "--quiet")
    if _git(where, "cat-file", "-e", f"{commit}^{{commit}}", check=False).returncode == 0:
        return False
    # by SHA first (GitHub and protocol v2 servers allow it), else everything the remote advertises
    if _git(where, "fetch", "--quiet", "--depth", "1", repo, commit, check=False).returncode != 0:
        _git(
            where, "fetch", "--quiet", repo, "+refs/heads/*:refs/remotes/origin/*", "+refs/tags/*:refs/tags/*"
        )
    if _git(where, "cat-file", "-e", f"{commit}^{{commit}}", check=False).returncode != 0:
        raise FetchError(f"{repo} has no commit {commit}: check sparkfold_image_series_ref.commit")
    return True


def _listing(where: Path, commit: str, folder: str) -> list[str]:
    out = _git(where, "ls-tree", "--name-only", f"{commit}:{folder}").stdout.decode()
    return sorted((name for name in out.splitlines() if name.endswith(".patch")), key=lambda n: n.encode())


def fetch_series(
    *,
    repo: str,
    commit: str,
    folder: str,
    dest: str | Path,
    files: Sequence[SeriesFile] = (),
    strip: int = 0,
) -> Fetched:
    """Fetch ``folder`` of ``repo`` at ``commit``, verify ``files`` and lay them out as a series."""
    if not _COMMIT.match(commit):
        raise FetchError(f"the series commit must be a full 40-hex commit, not {commit!r} (a tag can move)")
    folder = folder.strip("/") or "."
    dest = Path(dest)
    source = f"{repo}@{commit[:12]}:{folder}"
    fetched = _checkout(repo, commit, dest / "checkout")
    chosen = list(files) or [SeriesFile(name) for name in _listing(dest / "checkout", commit, folder)]
    if not chosen:
        raise FetchError(f"{source} holds no *.patch file")
    if len({f.name for f in chosen}) != len(chosen):
        raise FetchError(f"{source}: a file is listed twice")
    contents: list[tuple[SeriesFile, bytes]] = []
    for entry in chosen:
        blob = _git(dest / "checkout", "show", f"{commit}:{folder}/{entry.name}", check=False)
        if blob.returncode != 0:
            raise FetchError(f"{entry.name} is not in {source}")
        digest = hashlib.sha256(blob.stdout).hexdigest()
        if entry.sha256 is not None and digest != entry.sha256:
            raise DigestMismatch(entry.name, entry.sha256, digest, source)
        contents.append((SeriesFile(entry.name, digest), blob.stdout))
    out = dest / "series"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    for entry, data in contents:
        (out / entry.name).write_bytes(data)
    lines = [f"# {source}: verified by sparkfold image fetch"] + [f"{e.name} -p{strip}" for e, _ in contents]
    (out / "series").write_text("\n".join(lines) + "\n")
    unpinned = tuple(entry.name for entry in chosen if entry.sha256 is None)
    return Fetched(commit, folder, out / "series", tuple(e for e, _ in contents), fetched, unpinned)
