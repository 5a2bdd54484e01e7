"""The content digest of a build context folder (``sparkfold_image_source: context``).

An image built from a ready context (the testbed's TensorFold stand-in) has no TensorFold commit
or base image of its own to hash: its files are what it is. The digest covers every file's path,
mode bit for execution and content, so an edited file or a new one is another image, and a
touched but unchanged one is not.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

__all__ = ["context_digest"]


def context_digest(folder: Path) -> str:
    """``sha256:<hex>`` over the folder's regular files, in path order; symlinks by their target."""
    if not folder.is_dir():
        raise OSError(f"build context {folder} is not a folder")
    outer = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file() or p.is_symlink()):
        relative = path.relative_to(folder).as_posix()
        if path.is_symlink():
            entry = f"link {relative} {os.readlink(path)}"
        else:
            inner = hashlib.sha256()
            with path.open("rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    inner.update(block)
            executable = "x" if os.access(path, os.X_OK) else "-"
            entry = f"file {relative} {executable} {inner.hexdigest()}"
        outer.update(entry.encode() + b"\n")
    return f"sha256:{outer.hexdigest()}"
