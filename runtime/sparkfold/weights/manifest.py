"""The weights manifest: every file of a model directory with its size and sha256.

One JSON document (format ``sparkfold-weights-manifest``, version 1), written with sorted keys and
no timestamp, so the same files always give the same bytes (an unchanged re-run changes nothing)::

    {
      "digest": "<sha256 of the file list, see below>",
      "files": [{"path": "config.json", "sha256": "<64 hex>", "size": 1234}, ...],
      "format": "sparkfold-weights-manifest",
      "repo": "org/name" | null,
      "revision": "<40-hex commit>" | null,
      "total_bytes": 176000000000,
      "version": 1
    }

``files`` is sorted by path in byte order (as ``LC_ALL=C sort``); paths are relative, with ``/``.
``digest`` is the sha256 of the lines ``"<sha256>  <size>  <path>\\n"`` in that order: two nodes
holding the same files report the same digest. A manifest whose ``total_bytes`` or ``digest`` does not
match its file list is refused (a hand edit or a truncated copy).

By default a directory's manifest sits beside it (``DIR.manifest.json``), outside the directory, so a
copy into the directory (``rsync --delete``) never touches it. Walking a directory skips
huggingface_hub's download bookkeeping (``.cache/huggingface/`` at the top) and rsync's partial
files (``.rsync-partial/`` at any depth).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path, PurePosixPath
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from sparkfold.weights.errors import ManifestError
from sparkfold.weights.hashing import DEFAULT_JOBS, hash_files
from sparkfold.weights.progress import DEFAULT_INTERVAL_S, Progress

__all__ = [
    "FORMAT",
    "SKIPPED_DIRS",
    "VERSION",
    "Manifest",
    "ManifestFile",
    "build_manifest",
    "default_manifest_path",
    "list_files",
    "read_manifest",
    "write_manifest",
]

FORMAT = "sparkfold-weights-manifest"
VERSION = 1
# directories that belong to the tools, not the model: (top-level path, or a name skipped at any depth)
SKIPPED_DIRS = (".cache/huggingface", ".rsync-partial")

_SHA256 = re.compile(r"[0-9a-f]{64}")


class ManifestFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str = Field(..., min_length=1, description="relative path inside the directory, '/'-separated")
    size: int = Field(..., ge=0, description="bytes")
    sha256: str = Field(..., description="sha256 of the content, 64 lowercase hex")

    @field_validator("path")
    @classmethod
    def _relative(cls, value: str) -> str:
        parts = PurePosixPath(value).parts
        if value.startswith("/") or "\\" in value or any(p in ("", ".", "..") for p in parts):
            raise ValueError(f"path must be relative and stay inside the directory, not {value!r}")
        if str(PurePosixPath(value)) != value:
            raise ValueError(f"path must be normalized, not {value!r}")
        return value

    @field_validator("sha256")
    @classmethod
    def _hex(cls, value: str) -> str:
        if not _SHA256.fullmatch(value):
            raise ValueError(f"sha256 must be 64 lowercase hex digits, not {value!r}")
        return value


def _digest(files: Iterable[ManifestFile]) -> str:
    h = hashlib.sha256()
    for f in files:
        h.update(f"{f.sha256}  {f.size}  {f.path}\n".encode())
    return h.hexdigest()


def _byte_order(path: str) -> bytes:
    return path.encode("utf-8", "surrogateescape")


class Manifest(BaseModel):
    """A validated manifest; build one with :meth:`of`, read one with :func:`read_manifest`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["sparkfold-weights-manifest"] = "sparkfold-weights-manifest"
    version: Literal[1] = 1
    repo: str | None = Field(None, description="Hugging Face repo id, when the files came from the Hub")
    revision: str | None = Field(None, description="the commit the files came from, when known")
    total_bytes: int = Field(..., ge=0)
    digest: str
    files: tuple[ManifestFile, ...]

    @model_validator(mode="after")
    def _consistent(self) -> Manifest:
        paths = [f.path for f in self.files]
        if paths != sorted(paths, key=_byte_order) or len(set(paths)) != len(paths):
            raise ValueError("files must be sorted by path (byte order) and unique")
        if self.total_bytes != sum(f.size for f in self.files):
            raise ValueError("total_bytes is not the sum of the file sizes")
        if self.digest != _digest(self.files):
            raise ValueError("digest does not match the file list")
        return self

    @classmethod
    def of(
        cls, files: Iterable[ManifestFile], *, repo: str | None = None, revision: str | None = None
    ) -> Manifest:
        ordered = tuple(sorted(files, key=lambda f: _byte_order(f.path)))
        return cls(
            repo=repo,
            revision=revision,
            total_bytes=sum(f.size for f in ordered),
            digest=_digest(ordered),
            files=ordered,
        )

    def by_path(self) -> dict[str, ManifestFile]:
        return {f.path: f for f in self.files}

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"


def default_manifest_path(directory: str | os.PathLike[str]) -> Path:
    """``/store/model`` -> ``/store/model.manifest.json`` (beside the directory, not in it)."""
    return Path(os.path.normpath(os.fspath(directory)) + ".manifest.json")


def list_files(root: Path) -> dict[str, int]:
    """Every regular file under ``root`` (links to files followed) -> its size, by relative path."""
    if not root.is_dir():
        return {}
    found: dict[str, int] = {}
    for current, dirs, names in os.walk(root):
        rel_dir = Path(current).relative_to(root).as_posix()
        dirs[:] = [
            d
            for d in dirs
            if d != ".rsync-partial" and (d if rel_dir == "." else f"{rel_dir}/{d}") != ".cache/huggingface"
        ]
        for name in names:
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            try:
                found[rel] = (root / rel).stat().st_size
            except FileNotFoundError:  # a dangling link: not a file of the model
                continue
    return dict(sorted(found.items(), key=lambda item: _byte_order(item[0])))


def build_manifest(
    root: Path,
    *,
    repo: str | None = None,
    revision: str | None = None,
    jobs: int = DEFAULT_JOBS,
    interval_s: float = DEFAULT_INTERVAL_S,
) -> Manifest:
    """Hash every file under ``root`` (progress on stderr) into a manifest."""
    if not root.is_dir():
        raise ManifestError(f"{root} is not a directory: give the model directory to describe")
    sizes = list_files(root)
    progress = Progress("hash", sum(sizes.values()), interval_s=interval_s)
    digests = hash_files(root, sizes, jobs=jobs, progress=progress)
    files = [ManifestFile(path=d.path, size=d.size, sha256=d.sha256) for d in digests.values()]
    return Manifest.of(files, repo=repo, revision=revision)


def read_manifest(path: Path) -> Manifest:
    try:
        raw = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ManifestError(
            f"{path}: no such manifest: write it with `sparkfold weights manifest DIR --out {path}` "
            "or give --manifest"
        ) from None
    except OSError as exc:
        raise ManifestError(f"{path}: cannot read the manifest ({exc.strerror})") from None
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ManifestError(f"{path}: not JSON ({exc.msg} at line {exc.lineno}): write it again") from None
    if isinstance(data, Mapping) and data.get("format") != FORMAT:
        raise ManifestError(f"{path}: not a {FORMAT} file (format is {data.get('format')!r})")
    try:
        return Manifest.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "manifest"
        raise ManifestError(f"{path}: {where}: {first['msg']}: write the manifest again") from None


def write_manifest(manifest: Manifest, path: Path) -> bool:
    """Write ``path`` atomically; returns False (and writes nothing) when it already holds the same."""
    text = manifest.to_json()
    try:
        if path.read_text(encoding="utf-8") == text:
            return False
    except (FileNotFoundError, UnicodeDecodeError):
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    tmp.chmod(0o644)
    os.replace(tmp, path)
    return True
