"""sha256 (and, where the Hub needs it, the git blob id) of files, read once in chunks.

Large files are read in :data:`CHUNK_BYTES` pieces, so memory stays flat and progress can be
reported while a 5 GB shard is hashed. ``hashlib`` releases the GIL on large buffers, so several
files hash in parallel threads (``jobs``) as fast as the disk delivers.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from sparkfold.weights.progress import Progress

__all__ = ["CHUNK_BYTES", "DEFAULT_JOBS", "FileDigest", "git_blob_id", "hash_file", "hash_files"]

CHUNK_BYTES = 8 * 1024 * 1024
DEFAULT_JOBS = max(1, min(4, os.cpu_count() or 1))


@dataclass(frozen=True)
class FileDigest:
    """A file's size and sha256 as read now; ``git_oid`` only when asked for."""

    path: str
    size: int
    sha256: str
    git_oid: str | None = None


def git_blob_id(data: bytes) -> str:
    """The git object id of a blob holding ``data`` (what the Hub lists for files outside LFS)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def hash_file(
    root: Path, rel: str, *, git_oid: bool = False, on_bytes: Callable[[int], None] | None = None
) -> FileDigest:
    """Hash ``root/rel`` in chunks; ``on_bytes(n)`` is called after each chunk."""
    path = root / rel
    sha = hashlib.sha256()
    size = path.stat().st_size
    blob = hashlib.sha1(b"blob %d\0" % size, usedforsecurity=False) if git_oid else None
    buffer = bytearray(min(CHUNK_BYTES, max(size, 1)))
    view = memoryview(buffer)
    read = 0
    with path.open("rb", buffering=0) as f:
        while n := f.readinto(view):
            chunk = view[:n]
            sha.update(chunk)
            if blob is not None:
                blob.update(chunk)
            read += n
            if on_bytes is not None:
                on_bytes(n)
    return FileDigest(rel, read, sha.hexdigest(), blob.hexdigest() if blob is not None else None)


def hash_files(
    root: Path,
    rels: Iterable[str],
    *,
    jobs: int = DEFAULT_JOBS,
    progress: Progress | None = None,
    git_oid_for: frozenset[str] = frozenset(),
) -> dict[str, FileDigest]:
    """Hash many files under ``root``, ``jobs`` at a time; returns them by relative path."""

    def one(rel: str) -> FileDigest:
        on_bytes = (lambda n: progress.advance(n, rel)) if progress is not None else None
        return hash_file(root, rel, git_oid=rel in git_oid_for, on_bytes=on_bytes)

    with ThreadPoolExecutor(max_workers=max(1, jobs), thread_name_prefix="sparkfold-hash") as pool:
        digests = list(pool.map(one, rels))
    if progress is not None:
        progress.finish(f"{len(digests)} files")
    return {d.path: d for d in digests}
