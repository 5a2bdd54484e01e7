"""Will the store hold what is still missing? Counts only the files not yet in place.

A file already there at its manifest size costs nothing; a missing or wrong-sized one costs its full
size (it is fetched or copied whole). ``reserve`` is kept free on top, so the node still has room for
logs and kernel caches after the download.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from sparkfold.units import GIB
from sparkfold.weights.errors import DiskSpaceError
from sparkfold.weights.progress import human_bytes

__all__ = ["DEFAULT_RESERVE_GIB", "SpaceCheck", "check_space", "free_bytes", "missing_bytes"]

DEFAULT_RESERVE_GIB = 5.0


@dataclass(frozen=True)
class SpaceCheck:
    directory: str
    need_bytes: int
    free_bytes: int
    reserve_bytes: int

    @property
    def ok(self) -> bool:
        return self.need_bytes == 0 or self.need_bytes + self.reserve_bytes <= self.free_bytes

    def to_json(self) -> dict[str, object]:
        return {
            "ok": self.ok,
            "dir": self.directory,
            "need_bytes": self.need_bytes,
            "free_bytes": self.free_bytes,
            "reserve_bytes": self.reserve_bytes,
        }


def free_bytes(path: Path) -> int:
    """Free bytes for an unprivileged writer on the filesystem that will hold ``path``."""
    probe = path.absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return shutil.disk_usage(probe).free


def missing_bytes(expected: Iterable[tuple[str, int]], present: Mapping[str, int]) -> int:
    """Bytes still to transfer: the full size of each expected file not present at its size."""
    return sum(size for path, size in expected if present.get(path) != size)


def check_space(
    directory: Path,
    need: int,
    *,
    reserve_gib: float = DEFAULT_RESERVE_GIB,
    free: Callable[[Path], int] = free_bytes,
) -> SpaceCheck:
    """Raise :class:`DiskSpaceError` (the exact message operators see) when ``need`` does not fit."""
    check = SpaceCheck(str(directory), need, free(directory), int(reserve_gib * GIB))
    if not check.ok:
        raise DiskSpaceError(
            f"{directory}: need {human_bytes(need)} more (and {human_bytes(check.reserve_bytes)} kept free), "
            f"{human_bytes(check.free_bytes)} free: free space or choose another store"
        )
    return check
