"""Compare a directory with its manifest: which files are missing, extra, or differ, by name."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from sparkfold.weights.errors import PinError, WeightsError
from sparkfold.weights.hashing import DEFAULT_JOBS, FileDigest, hash_files
from sparkfold.weights.manifest import Manifest, list_files
from sparkfold.weights.progress import DEFAULT_INTERVAL_S, Progress

__all__ = ["Mismatch", "VerifyError", "VerifyReport", "check_pins", "compare", "parse_pins", "verify_dir"]

Mode = Literal["sha256", "sizes"]
_NAMED = 5  # files named per kind in the one-line message; --json lists them all


@dataclass(frozen=True)
class Mismatch:
    path: str
    expected: int | str
    actual: int | str


@dataclass
class VerifyReport:
    """The outcome of one verification; ``to_json()`` is the documented ``--json`` shape."""

    directory: str
    mode: Mode
    manifest: Manifest
    missing: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    wrong_size: list[Mismatch] = field(default_factory=list)
    wrong_sha256: list[Mismatch] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.missing or self.extra or self.wrong_size or self.wrong_sha256)

    def bad_paths(self) -> list[str]:
        """Files that must be fetched or copied again (missing or differing; not the extra ones)."""
        return self.missing + [m.path for m in self.wrong_size + self.wrong_sha256]

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "dir": self.directory,
            "mode": self.mode,
            "repo": self.manifest.repo,
            "revision": self.manifest.revision,
            "digest": self.manifest.digest,
            "files": len(self.manifest.files),
            "total_bytes": self.manifest.total_bytes,
            "missing": self.missing,
            "extra": self.extra,
            "wrong_size": [asdict(m) for m in self.wrong_size],
            "wrong_sha256": [asdict(m) for m in self.wrong_sha256],
        }

    def findings(self) -> str:
        """What differs, by name (at most a few per kind), without the advice."""
        if self.ok:
            checked = "sizes" if self.mode == "sizes" else "sizes and sha256"
            return f"{self.directory}: {len(self.manifest.files)} files match the manifest ({checked})"
        kinds = [
            ("missing", self.missing),
            ("wrong size", [m.path for m in self.wrong_size]),
            ("wrong sha256", [m.path for m in self.wrong_sha256]),
            ("not in the manifest", self.extra),
        ]
        said = "; ".join(f"{kind}: {_names(paths)}" for kind, paths in kinds if paths)
        return f"{self.directory} does not match its manifest ({said})"

    def message(self) -> str:
        """The one line an operator sees: the findings and what to do."""
        if self.ok:
            return self.findings()
        todos = ["fetch or copy the weights again"] if self.bad_paths() else []
        if self.extra:
            todos.append("remove the files not in the manifest")
        return f"{self.findings()}: {' and '.join(todos)}"


class VerifyError(WeightsError):
    """The files on disk differ from the manifest; carries the report."""

    def __init__(self, report: VerifyReport) -> None:
        super().__init__(report.message())
        self.report = report


def _names(paths: list[str]) -> str:
    shown = ", ".join(paths[:_NAMED])
    return shown + (f" and {len(paths) - _NAMED} more" if len(paths) > _NAMED else "")


def compare(
    directory: str,
    manifest: Manifest,
    sizes: Mapping[str, int],
    digests: Mapping[str, FileDigest] | None,
) -> VerifyReport:
    """The pure comparison: on-disk sizes (and sha256 when ``digests`` is given) against the manifest."""
    report = VerifyReport(directory, "sizes" if digests is None else "sha256", manifest)
    expected = manifest.by_path()
    report.extra = [path for path in sizes if path not in expected]
    for path, entry in expected.items():
        if path not in sizes:
            report.missing.append(path)
        elif sizes[path] != entry.size:
            report.wrong_size.append(Mismatch(path, entry.size, sizes[path]))
        elif digests is not None and digests[path].sha256 != entry.sha256:
            report.wrong_sha256.append(Mismatch(path, entry.sha256, digests[path].sha256))
    return report


def verify_dir(
    root: Path,
    manifest: Manifest,
    *,
    sizes_only: bool = False,
    jobs: int = DEFAULT_JOBS,
    interval_s: float = DEFAULT_INTERVAL_S,
) -> VerifyReport:
    """Check ``root`` against ``manifest``: sizes first, then sha256 of the files whose size is right."""
    sizes = list_files(root)
    digests = None
    if not sizes_only:
        expected = manifest.by_path()
        to_hash = [p for p, size in sizes.items() if p in expected and expected[p].size == size]
        progress = Progress("verify", sum(sizes[p] for p in to_hash), interval_s=interval_s)
        digests = hash_files(root, to_hash, jobs=jobs, progress=progress)
    return compare(str(root), manifest, sizes, digests)


_PIN = re.compile(r"(?P<path>.+)=(?P<sha256>[0-9a-f]{64})")


def parse_pins(texts: Iterable[str]) -> dict[str, str]:
    """``PATH=SHA256`` entries (``sparkfold weights fetch --pin``) as ``{path: sha256}``."""
    pins: dict[str, str] = {}
    for text in texts:
        if (found := _PIN.fullmatch(text)) is None:
            raise PinError(f"not a file pin (PATH=<64 lowercase hex sha256>): {text!r}")
        pins[found["path"]] = found["sha256"]
    return pins


def check_pins(directory: str, manifest: Manifest, pins: Mapping[str, str]) -> None:
    """Refuse ``manifest`` (what ``directory`` holds) unless every pinned file is there with its
    pinned sha256; a file without a pin passes (trust on first use: its digest is recorded)."""
    held = {f.path: f.sha256 for f in manifest.files}
    wrong = [Mismatch(path, sha, held.get(path, "")) for path, sha in sorted(pins.items())]
    wrong = [m for m in wrong if m.actual != m.expected]
    if not wrong:
        return
    source = f"{manifest.repo or directory}@{manifest.revision or '?'}"
    said = "; ".join(
        f"{m.path} has sha256 {m.actual}, not the pinned {m.expected}"
        if m.actual
        else f"{m.path} is pinned ({m.expected}) but not in {source}"
        for m in wrong[:_NAMED]
    )
    more = f" and {len(wrong) - _NAMED} more" if len(wrong) > _NAMED else ""
    raise PinError(
        f"{directory} is refused and nothing is served from it: {said}{more}. If the change is intended, "
        "review it and pin the new digest"
    )
