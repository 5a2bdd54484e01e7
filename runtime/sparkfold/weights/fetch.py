"""``sparkfold weights fetch``: a pinned Hub revision into a store directory, verified, with its manifest.

The steps, each skipped when there is nothing to do:

1. refuse a moving revision (branch, tag) unless allowed; a 40-hex commit is the pin;
2. when the manifest beside ``dest`` already names this repo and commit and the files match it (sizes
   by default, sha256 with ``recheck="sha256"``), stop: nothing changed, and the Hub is not contacted,
   so this also works with ``HF_HUB_OFFLINE=1``;
3. list the revision's files (sizes, LFS sha256, git ids) from the Hub (for a moving revision, step 2
   runs now, with the commit the branch points to);
4. refuse a directory that holds files the commit does not have, before downloading anything;
5. check the disk for what is still missing only;
6. download the missing files (a cut transfer is resumed with a Range request; a finished file is never
   fetched again), progress on stderr; one fetch per directory at a time;
7. hash every file and compare with the Hub (LFS files by sha256, the others by git blob id); a file
   that differs is fetched once more, then the fetch fails naming it;
8. refuse the files when one differs from the sha256 pinned for it (``pins``; the manifest is then not
   written), and write the manifest (the Hub's sizes and sha256). A store already in place is held to
   the pins too.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from sparkfold.weights import hub
from sparkfold.weights.disk import DEFAULT_RESERVE_GIB, SpaceCheck, check_space, free_bytes, missing_bytes
from sparkfold.weights.errors import HubError, ManifestError
from sparkfold.weights.hashing import DEFAULT_JOBS, FileDigest, hash_files
from sparkfold.weights.manifest import (
    Manifest,
    ManifestFile,
    default_manifest_path,
    list_files,
    read_manifest,
    write_manifest,
)
from sparkfold.weights.progress import DEFAULT_INTERVAL_S, Progress
from sparkfold.weights.verify import VerifyError, check_pins, compare, verify_dir

__all__ = ["FetchResult", "fetch"]

Recheck = Literal["sizes", "sha256"]


@dataclass
class FetchResult:
    """What one fetch did (or, on a dry run, would do); ``to_json()`` is the documented ``--json`` shape."""

    repo: str
    revision: str
    commit: str
    dest: Path
    manifest_path: Path
    files: int
    total_bytes: int
    digest: str | None  # None on a dry run that would download
    checked: str | None  # "sizes" | "sha256": how the files were checked; None on such a dry run
    downloaded: list[str] = field(default_factory=list)
    downloaded_bytes: int = 0
    manifest_written: bool = False
    space: SpaceCheck | None = None
    dry_run: bool = False

    @classmethod
    def in_place(
        cls, repo: str, revision: str, dest: Path, manifest_path: Path, manifest: Manifest, checked: str
    ) -> FetchResult:
        commit = manifest.revision or revision
        return cls(
            repo,
            revision,
            commit,
            dest,
            manifest_path,
            len(manifest.files),
            manifest.total_bytes,
            manifest.digest,
            checked,
        )

    @property
    def changed(self) -> bool:
        return bool(self.downloaded) or self.manifest_written

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": True,
            "changed": self.changed,
            "dry_run": self.dry_run,
            "repo": self.repo,
            "revision": self.revision,
            "commit": self.commit,
            "dest": str(self.dest),
            "manifest": str(self.manifest_path),
            "digest": self.digest,
            "files": self.files,
            "total_bytes": self.total_bytes,
            "downloaded": self.downloaded,
            "downloaded_bytes": self.downloaded_bytes,
            "checked": self.checked,
            "space": self.space.to_json() if self.space is not None else None,
        }


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _in_place(
    manifest_path: Path, repo: str, commit: str, dest: Path, recheck: Recheck, opts: _Options
) -> tuple[Manifest | None, set[str]]:
    """The manifest when ``dest`` already holds this commit intact; else the files known to be corrupt."""
    try:
        manifest = read_manifest(manifest_path)
    except ManifestError:
        return None, set()
    if (manifest.repo, manifest.revision) != (repo, commit):
        return None, set()
    report = verify_dir(
        dest, manifest, sizes_only=recheck == "sizes", jobs=opts.jobs, interval_s=opts.interval_s
    )
    if report.ok:
        return manifest, set()
    opts.warn(f"{report.findings()}: fetching again")
    return None, {m.path for m in report.wrong_sha256}


def _matches(remote: hub.RemoteFile, digest: FileDigest) -> bool:
    if digest.size != remote.size:
        return False
    if remote.sha256 is not None:
        return digest.sha256 == remote.sha256
    return remote.git_oid is None or digest.git_oid == remote.git_oid


@dataclass(frozen=True)
class _Options:
    jobs: int
    interval_s: float
    warn: Callable[[str], None]


@dataclass(frozen=True)
class _Source:
    snap: hub.RemoteSnapshot
    dest: Path
    endpoint: str | None
    token: str | None
    token_file: str | None

    def get(self, files: list[hub.RemoteFile], opts: _Options) -> None:
        """Download ``files`` in order (each replaces any stale copy), progress on stderr."""
        if not files:
            return
        progress = Progress("download", sum(f.size for f in files), interval_s=opts.interval_s)
        finished, current = 0, ""
        with hub.watch_partial_downloads(self.dest, progress, lambda: (finished, current)):
            for f in files:
                current = f.path
                hub.forget_local_copy(self.dest, f.path)
                hub.download(
                    self.snap,
                    f.path,
                    self.dest,
                    endpoint=self.endpoint,
                    token=self.token,
                    token_file=self.token_file,
                )
                finished += f.size
        progress.done = finished
        progress.finish(f"{len(files)} files from {self.snap.repo}@{self.snap.commit[:12]}")

    def hash_and_repair(self, opts: _Options) -> tuple[dict[str, FileDigest], list[str]]:
        """Hash every file and compare with the Hub; a differing file is fetched once more."""
        remote = {f.path: f for f in self.snap.files}
        need_oid = frozenset(f.path for f in self.snap.files if f.sha256 is None)
        progress = Progress("verify", sum(f.size for f in self.snap.files), interval_s=opts.interval_s)
        digests = hash_files(self.dest, list(remote), jobs=opts.jobs, progress=progress, git_oid_for=need_oid)
        bad = [remote[p] for p, d in digests.items() if not _matches(remote[p], d)]
        if not bad:
            return digests, []
        opts.warn(
            f"{self.dest}: {', '.join(f.path for f in bad)} differ from the Hub after download: "
            "fetching them again"
        )
        self.get(bad, opts)
        digests.update(hash_files(self.dest, [f.path for f in bad], jobs=opts.jobs, git_oid_for=need_oid))
        still = [f.path for f in bad if not _matches(f, digests[f.path])]
        for path in still:
            hub.forget_local_copy(self.dest, path)
        if still:
            raise HubError(
                f"{self.dest}: {', '.join(still)} still differ from {self.snap.repo}@{self.snap.commit} "
                "after a second download: check the disk and the network path, then run the fetch again"
            )
        return digests, [f.path for f in bad]


def fetch(
    repo: str,
    revision: str,
    dest: Path,
    *,
    manifest_path: Path | None = None,
    token_file: Path | None = None,
    allow_moving_revision: bool = False,
    endpoint: str | None = None,
    reserve_gib: float = DEFAULT_RESERVE_GIB,
    recheck: Recheck = "sizes",
    jobs: int = DEFAULT_JOBS,
    interval_s: float = DEFAULT_INTERVAL_S,
    dry_run: bool = False,
    warn: Callable[[str], None] = _stderr,
    free: Callable[[Path], int] = free_bytes,
    pins: Mapping[str, str] | None = None,
) -> FetchResult:
    """Fetch ``repo`` at ``revision`` into ``dest`` (the steps in the module docstring).

    ``dry_run`` stops after the disk check and writes nothing: the answer lists what would be
    downloaded (Ansible's check mode). ``pins`` maps a file's path to the sha256 it must have.
    """
    pins = pins or {}
    hub.require_pin(repo, revision, allow_moving=allow_moving_revision)
    manifest_path = manifest_path or default_manifest_path(dest)
    opts = _Options(jobs, interval_s, warn)
    stale: set[str] = set()
    if hub.is_commit(revision):
        done, stale = _in_place(manifest_path, repo, revision, dest, recheck, opts)
        if done is not None:
            check_pins(str(dest), done, pins)
            return FetchResult.in_place(repo, revision, dest, manifest_path, done, recheck)
    if hub.hub_offline():
        raise HubError(
            f"{repo}@{revision}: HF_HUB_OFFLINE is set and {dest} does not hold this revision: "
            "unset HF_HUB_OFFLINE to download, or copy the files in and run `sparkfold weights verify`"
        )

    token = hub.read_token_file(token_file, warn) if token_file is not None else None
    where = str(token_file) if token_file is not None else None
    snap = hub.snapshot(repo, revision, endpoint=endpoint, token=token, token_file=where)
    if not hub.is_commit(revision):
        done, stale = _in_place(manifest_path, repo, snap.commit, dest, recheck, opts)
        if done is not None:
            check_pins(str(dest), done, pins)
            return FetchResult.in_place(repo, revision, dest, manifest_path, done, recheck)

    present = list_files(dest)
    listed = {f.path for f in snap.files}
    if leftovers := [path for path in present if path not in listed]:
        raise HubError(
            f"{dest} holds files that are not in {repo}@{snap.commit} ({', '.join(leftovers[:5])}): "
            "remove them, or fetch into a directory of its own"
        )
    todo = [f for f in snap.files if present.get(f.path) != f.size or f.path in stale]
    need = missing_bytes(((f.path, f.size) for f in todo), {})
    space = check_space(dest, need, reserve_gib=reserve_gib, free=free)
    total = sum(f.size for f in snap.files)
    if dry_run:
        planned = [f.path for f in todo]
        return FetchResult(
            repo, revision, snap.commit, dest, manifest_path, len(snap.files), total, None, None,
            planned, need, manifest_written=True, space=space, dry_run=True,
        )  # fmt: skip
    source = _Source(snap, dest, endpoint, token, where)
    with hub.exclusive(dest):
        source.get(todo, opts)
        digests, again = source.hash_and_repair(opts)
    downloaded = [f.path for f in todo] + [path for path in again if path not in {f.path for f in todo}]

    manifest = Manifest.of(
        (ManifestFile(path=p, size=d.size, sha256=d.sha256) for p, d in digests.items()),
        repo=repo,
        revision=snap.commit,
    )
    report = compare(str(dest), manifest, list_files(dest), digests)
    if not report.ok:  # something appeared in the directory while we worked
        raise VerifyError(report)
    check_pins(str(dest), manifest, pins)
    written = write_manifest(manifest, manifest_path)
    by_path = manifest.by_path()
    return FetchResult(
        repo, revision, snap.commit, dest, manifest_path, len(manifest.files), manifest.total_bytes,
        manifest.digest, "sha256", downloaded, sum(by_path[p].size for p in downloaded), written, space,
    )  # fmt: skip
