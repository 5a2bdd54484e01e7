"""The patch series of the engine image: read it, apply it in order, hash it.

A series lives in ``patches/tensorfold/<ref>/``: a ``series`` file and the patches it names. The
``series`` file is quilt's format: one patch per line, in the order they apply, each optionally
followed by its strip level (``-p0``; default ``-p1``; one level for the whole series); ``#``
starts a comment, blank lines are ignored. Patch names are plain file names in the same folder.

:func:`apply_series` applies the series to a source tree with ``git apply`` (it works with or
without a repository, applies whole patches or nothing, and never applies with fuzz, which is what a
pinned source wants). Before anything is written:

- the leading patches whose reversal (last first) applies are already there: a no-op, so re-running
  converges, also after a partial run;
- the rest must apply, in order, as one: the patches go to ``git apply`` as one input, which it
  applies in memory one after another (a patch may build on an earlier one) and writes only if
  all apply;
- otherwise the first patch that does not apply is found and :class:`PatchConflict` names it and
  quotes git. Nothing was written, so the tree is as it was.

:func:`series_hash` is the image label (:data:`LABEL`): sha256 over the base image, the TensorFold
ref, the ordered series (each patch's name, strip level and content hash), the pip extras and, when
one is applied first, an external series' source and digests (:mod:`sparkfold.image.external`).
It follows content: a changed patch, order, strip level, base, ref or extra changes it; a comment
in ``series`` does not.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

__all__ = [
    "LABEL",
    "Applied",
    "Patch",
    "PatchConflict",
    "PatchError",
    "Series",
    "SeriesError",
    "apply_series",
    "hash_of",
    "read_series",
    "series_hash",
]

LABEL = "org.sparkfold.tensorfold.series"
"""The image label that holds :func:`series_hash`; the image is rebuilt only when it changes."""

_ENTRY = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._+-]*)(?:\s+-p(?P<strip>[0-9]))?$")


class PatchError(Exception):
    """A series that cannot be used.

    PatchError
    ├── SeriesError     the series file is malformed or names a missing patch
    └── PatchConflict   a patch does not apply to the tree (the tree is left as it was)
    """


class SeriesError(PatchError):
    pass


class PatchConflict(PatchError):
    def __init__(self, patch: str, tree: Path, detail: str) -> None:
        self.patch = patch
        self.detail = detail
        first = detail.strip().splitlines()[0] if detail.strip() else "no detail from git"
        super().__init__(f"patch {patch} does not apply to {tree}: {first}; the tree is unchanged")


@dataclass(frozen=True)
class Patch:
    name: str
    path: Path
    strip: int = 1

    def digest(self) -> str:
        return hashlib.sha256(self.path.read_bytes()).hexdigest()


@dataclass(frozen=True)
class Series:
    path: Path
    patches: tuple[Patch, ...]


@dataclass(frozen=True)
class Applied:
    name: str
    state: Literal["applied", "already applied"]


def read_series(path: str | Path) -> Series:
    """Parse a ``series`` file; every listed patch must exist beside it, each name once."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SeriesError(f"{path}: cannot read: {exc.strerror or exc}") from None
    patches: list[Patch] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = _ENTRY.match(line)
        if match is None:
            raise SeriesError(f"{path}:{number}: not a patch entry (NAME or NAME -pN): {line!r}")
        name = match["name"]
        if any(p.name == name for p in patches):
            raise SeriesError(f"{path}:{number}: {name} is listed twice")
        patch_path = path.parent / name
        if not patch_path.is_file():
            raise SeriesError(f"{path}:{number}: {name} is listed but {patch_path} does not exist")
        patches.append(Patch(name, patch_path, int(match["strip"] or 1)))
    return Series(path, tuple(patches))


def series_hash(
    *,
    base: str,
    ref: str,
    patches: Sequence[tuple[str, int, str]],
    extras: Sequence[str],
    external: tuple[str, Sequence[tuple[str, int, str]]] | None = None,
) -> str:
    """sha256 of base image, TensorFold ref, ordered ``(name, strip, sha256)`` patches and extras.

    ``external`` is an external series applied first: its source (``URL@commit:folder``) and its
    ordered patches; without one the hash is what it always was.
    """
    canonical: dict[str, object] = {
        "base": base,
        "ref": ref,
        "patches": [[name, strip, digest] for name, strip, digest in patches],
        "extras": sorted(extra.strip() for extra in extras),
    }
    if external is not None:
        source, entries = external
        canonical["external"] = {"source": source, "patches": [list(entry) for entry in entries]}
    return hashlib.sha256(json.dumps(canonical, separators=(",", ":")).encode()).hexdigest()


def hash_of(
    series: Series,
    *,
    base: str,
    ref: str,
    extras: Sequence[str],
    external: tuple[str, Sequence[tuple[str, int, str]]] | None = None,
) -> str:
    """:func:`series_hash` of a series read from disk (after an optional external one)."""
    entries = [(p.name, p.strip, p.digest()) for p in series.patches]
    return series_hash(base=base, ref=ref, patches=entries, extras=extras, external=external)


def _git_apply(tree: Path, patches: Sequence[Patch], *options: str) -> subprocess.CompletedProcess[str]:
    """``git apply`` of several patches as one input: in order, in memory, written only if all apply.

    git chains patches to the same file only within one input, so the patches are concatenated
    (in series order also with ``--reverse``: git then undoes them last first).
    """
    # The tree's own repository, if it is the root of one, is fine; a repository *above* the tree
    # would make git read the patch's paths relative to that repository instead, so stop there.
    env = os.environ | {"GIT_CEILING_DIRECTORIES": str(tree.resolve().parent)}
    strip = f"-p{patches[0].strip}" if patches else "-p1"
    text = b"".join(_with_newline(p.path.read_bytes()) for p in patches)
    argv = ["git", "apply", strip, "--whitespace=nowarn", *options]
    try:
        result = subprocess.run(argv, cwd=tree, env=env, input=text, capture_output=True, check=False)
    except FileNotFoundError:
        raise PatchError("git is needed to apply the patch series: install git on this host") from None
    stderr = result.stderr.decode(errors="replace")
    return subprocess.CompletedProcess(argv, result.returncode, "", stderr)


def _with_newline(data: bytes) -> bytes:
    return data if data.endswith(b"\n") else data + b"\n"


def _applied_prefix(tree: Path, patches: Sequence[Patch]) -> int:
    """How many leading patches the tree already has: the largest k whose reversal applies."""
    for k in range(len(patches), 0, -1):
        if _git_apply(tree, patches[:k], "--check", "--reverse").returncode == 0:
            return k
    return 0


def apply_series(
    series: Series, tree: str | Path, *, progress: Callable[[Applied], None] | None = None
) -> list[Applied]:
    """Apply ``series`` to ``tree`` in order; the patches already there are a no-op.

    The tree may hold a leading part of the series (an earlier run, or a partial one): those
    patches are recognised by reversing them (last first), the rest are checked as one and applied
    as one. Raises :class:`PatchConflict` naming the first patch that does not apply; nothing is
    written then.
    """
    tree = Path(tree)
    if not tree.is_dir():
        raise PatchError(f"{tree} is not a directory")
    patches = series.patches
    if len({p.strip for p in patches}) > 1:
        raise SeriesError(f"{series.path}: one strip level for the whole series, please (found several)")
    done = _applied_prefix(tree, patches)
    rest = patches[done:]
    if rest and _git_apply(tree, rest, "--check").returncode != 0:
        for end in range(1, len(rest) + 1):
            check = _git_apply(tree, rest[:end], "--check")
            if check.returncode != 0:
                raise PatchConflict(rest[end - 1].name, tree, check.stderr)
    if rest:
        result = _git_apply(tree, rest)
        if result.returncode != 0:  # checked a moment ago; only a concurrent writer gets here
            raise PatchConflict(rest[0].name, tree, result.stderr)
    steps = [Applied(p.name, "already applied") for p in patches[:done]]
    steps += [Applied(p.name, "applied") for p in rest]
    for step in steps:
        if progress is not None:
            progress(step)
    return steps
