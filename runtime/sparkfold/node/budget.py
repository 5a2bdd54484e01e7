"""The engine's memory budget: what one rank will hold, against what this node can give it.

A GB10 that runs out of unified memory freezes rather than killing anything, so the engine's
footprint is added up from its settings before it starts and refused when it does not fit::

    footprint = weights + KV window + KV pool + kept states + drafter + vision + shm + activations
    limit     = usable memory - memory.reserve_gib
    usable    = MemTotal, or the memory limit of this node's cgroup where that is lower

Where each number comes from:

- **weights**: the checkpoint's bytes from its weights manifest (``<model>.manifest.json``, written
  by the weights stage), else the bytes on disk, split over ``engine.tp`` ranks; unknown until the
  weights are here (the check then waits for the engine's start, ``ExecStartPre``);
- **KV window**: ``engine.context`` tokens at :data:`KV_BYTES_PER_TOKEN` of ``engine.tensorfold.kv``
  (TensorFold's latent MLA rows plus the indexer keys, a full copy on each rank; bf16 when unset);
- **KV pool**: ``engine.tensorfold.pool_gib`` (TensorFold's ``TF_GLM_CACHE_GIB``, 3 when unset) and
  ``kept_bytes_gib``; **drafter**: its files, whole on every rank; **vision**: the tower on rank 0;
- **shm**: ``engine.tensorfold.shm_size``, the shared memory the rank may write (docker launcher);
- **activations**: ``memory.activation_gib`` plus :data:`ACTIVATION_PER_REQUEST_GIB` per request past
  4 (the recipe's measured reserve growth).

The same sum sizes the host-side limits: the container's ``--memory`` is :attr:`Budget.limit_gib`.
CUDA allocations on a GB10 are not charged to a cgroup, so those limits bound the host side only;
the guard (``sparkfold_guard``) judges by the node's available memory, which does see them.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkfold.config import Settings
from sparkfold.units import GIB
from sparkfold.weights.manifest import default_manifest_path, list_files, read_manifest

__all__ = [
    "ACTIVATION_PER_REQUEST_GIB",
    "KV_BYTES_PER_TOKEN",
    "Budget",
    "Item",
    "budget",
    "shm_bytes",
    "usable_memory",
]

KV_BYTES_PER_TOKEN = {"bf16": 19_200, "fp8": 9_600}
"""KV bytes per window token per rank: TensorFold's bf16 latent rows (reference: its GLM cache,
19,200 B/token/rank), halved by the recipe's FP8 rows."""
DEFAULT_POOL_GIB = 3.0
"""TensorFold's ``TF_GLM_CACHE_GIB`` when ``engine.tensorfold.pool_gib`` is unset."""
VISION_GIB = 1.8
"""The vision tower's weights and workspace, rank 0 only (the recipe: 1.05 + 0.75 GiB)."""
ACTIVATION_PER_REQUEST_GIB = 0.95
"""Working memory per request past 4 (the recipe's reserve rule)."""
_UNLIMITED = 1 << 60  # cgroup v1 writes "no limit" as a page-rounded LONG_MAX
_SIZE = re.compile(r"^([0-9]+)([bkmg]?)$")


@dataclass(frozen=True)
class Item:
    """One part of the footprint: its name, its size and where the number came from."""

    name: str
    gib: float
    source: str


@dataclass(frozen=True)
class Budget:
    """The footprint of this node's rank against this node's usable memory less the reserve."""

    items: tuple[Item, ...]
    usable_gib: float
    usable_source: str
    reserve_gib: float
    unknown: str = ""
    """Non-empty when a part cannot be measured yet (the weights are not here): what is missing."""
    window_bytes_per_token: int = 0

    @property
    def footprint_gib(self) -> float:
        return sum(item.gib for item in self.items)

    @property
    def limit_gib(self) -> float:
        return max(0.0, self.usable_gib - self.reserve_gib)

    @property
    def headroom_gib(self) -> float:
        return self.limit_gib - self.footprint_gib

    @property
    def fits(self) -> bool:
        return self.headroom_gib >= 0

    def item(self, name: str) -> Item | None:
        return next((item for item in self.items if item.name == name), None)

    def sum_text(self) -> str:
        """``weights 82.0 + KV window 9.4 + … = 108.7 GiB of 112.7 usable (121.7 less 9.0 reserve)``."""
        parts = " + ".join(f"{item.name} {item.gib:.1f}" for item in self.items)
        return (
            f"{parts} = {self.footprint_gib:.1f} GiB of {self.limit_gib:.1f} usable "
            f"({self.usable_source} {self.usable_gib:.1f} less the {self.reserve_gib:g} reserve)"
        )

    def advice(self, over_gib: float | None = None) -> str:
        """What to change, and by how much, to win back ``over_gib`` (default: the overshoot)."""
        over = max(0.0, -self.headroom_gib) if over_gib is None else over_gib
        ways: list[str] = []
        window = self.item("KV window")
        if window is not None and window.gib > over and self.window_bytes_per_token:
            fitting = int((window.gib - over) * GIB / self.window_bytes_per_token) // 4096 * 4096
            ways.append(f"lower engine.context to {fitting} or less")
        pool = self.item("KV pool")
        if pool is not None and pool.gib > over:
            ways.append(f"lower engine.tensorfold.pool_gib to {math.floor((pool.gib - over) * 10) / 10:g}")
        shm = self.item("shm")
        if shm is not None and shm.gib > over:
            ways.append(f"lower engine.tensorfold.shm_size to {math.floor(shm.gib - over)}g")
        if self.reserve_gib > over:
            ways.append(
                f"lower memory.reserve_gib to {self.reserve_gib - over:.1f} (only with room to spare)"
            )
        ways.append("run the engine on a node with more memory" if not ways else "a mix of these")
        return f"win back {over:.1f} GiB: " + ", or ".join(ways)

    def to_dict(self) -> dict[str, Any]:
        return {
            "items": {item.name: round(item.gib, 3) for item in self.items},
            "sources": {item.name: item.source for item in self.items},
            "footprint_gib": round(self.footprint_gib, 3),
            "usable_gib": round(self.usable_gib, 3),
            "usable_source": self.usable_source,
            "reserve_gib": self.reserve_gib,
            "limit_gib": round(self.limit_gib, 3),
            "headroom_gib": round(self.headroom_gib, 3),
            "fits": self.fits,
            "unknown": self.unknown,
            "sum": self.sum_text(),
        }


def shm_bytes(size: str) -> int:
    """``16g`` -> bytes (Docker's ``--shm-size`` units)."""
    match = _SIZE.match(size)
    if match is None:
        raise ValueError(f"not a size: {size!r}")
    number, unit = match.groups()
    return int(number) * {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": GIB}[unit]


def _model_bytes(root: Path, directory: str) -> tuple[int, str] | None:
    """The checkpoint's bytes from its manifest, else from the files on disk; None if neither."""
    path = root / directory.lstrip("/")
    manifest = default_manifest_path(path)
    if manifest.is_file():
        return read_manifest(manifest).total_bytes, f"manifest {default_manifest_path(directory)}"
    if path.is_dir():
        return sum(list_files(path).values()), f"files under {directory}"
    return None


def _cgroup_limit(root: Path) -> tuple[int, str] | None:
    """The lowest memory limit over this process's cgroup and its ancestors (v2, or v1 memory)."""
    try:
        lines = (root / "proc/self/cgroup").read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    limits: list[tuple[int, str]] = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            base, name = root / "sys/fs/cgroup", "memory.max"
        elif "memory" in controllers.split(","):
            base, name = root / "sys/fs/cgroup/memory", "memory.limit_in_bytes"
        else:
            continue
        where = Path(path.lstrip("/"))
        for folder in [where, *where.parents]:
            try:
                text = (base / folder / name).read_text(encoding="utf-8").strip()
            except OSError:
                continue
            if text.isdigit() and int(text) < _UNLIMITED:
                limits.append((int(text), f"cgroup /{folder} {name}".replace("/.", "/")))
    return min(limits) if limits else None


def usable_memory(root: Path = Path("/")) -> tuple[float, str]:
    """This node's memory in GiB and where it came from: MemTotal, or its cgroup's limit if lower."""
    total = 0
    meminfo = root / "proc/meminfo"
    if meminfo.is_file():
        for line in meminfo.read_text(encoding="utf-8").splitlines():
            if line.startswith("MemTotal:"):
                total = int(line.split()[1]) * 1024
    limit = _cgroup_limit(root)
    if limit is not None and (not total or limit[0] < total):
        return limit[0] / GIB, limit[1]
    return total / GIB, "MemTotal"


def budget(settings: Settings, root: Path = Path("/")) -> Budget:
    """Add up this node's rank of ``settings`` against this node (``root`` lets tests swap it)."""
    engine, memory = settings.engine, settings.memory
    items: list[Item] = []
    unknown = ""
    per_token = 0
    weights = _model_bytes(root, engine.model)
    if weights is None:
        unknown = f"the weights are not under {engine.model} yet"
    else:
        items.append(Item("weights", weights[0] / engine.tp / GIB, f"{weights[1]} / tp {engine.tp}"))
    if engine.kind == "tensorfold":
        tf = engine.tensorfold
        kv = tf.kv or "bf16"
        per_token = KV_BYTES_PER_TOKEN[kv]
        window = f"{engine.context:,} tokens x {per_token} B ({kv})"
        items.append(Item("KV window", engine.context * per_token / GIB, window))
        pool = tf.pool_gib if tf.pool_gib is not None else DEFAULT_POOL_GIB
        items.append(Item("KV pool", pool + (tf.kept_bytes_gib or 0.0), "pool_gib + kept_bytes_gib"))
        if tf.drafter != "none":
            drafter = _model_bytes(root, tf.drafter)
            if drafter is None:
                unknown = unknown or f"the drafter is not under {tf.drafter} yet"
            else:
                items.append(Item("drafter", drafter[0] / GIB, drafter[1]))
        if tf.vision and settings.node.rank == 0:
            items.append(Item("vision", VISION_GIB, "the vision tower, rank 0"))
        if tf.launcher == "docker":
            items.append(Item("shm", shm_bytes(tf.shm_size) / GIB, f"shm_size {tf.shm_size}"))
    extra = ACTIVATION_PER_REQUEST_GIB * max(0, engine.parallel - 4)
    how = f"activation_gib + {extra:g} for parallel {engine.parallel}"
    items.append(Item("activations", memory.activation_gib + extra, how))
    usable, source = usable_memory(root)
    return Budget(tuple(items), usable, source, memory.reserve_gib, unknown, per_token)
