"""The Hugging Face source: a pinned revision's file list, and one file's download, over huggingface_hub.

Everything that talks to the Hub is here, so the rest of the package never sees its exceptions: each
is turned into a :class:`HubError` or :class:`RevisionError` whose message says what to do, and never
contains the token. Files land in the store directory itself (huggingface_hub's ``local_dir`` mode:
plain files, plus its bookkeeping under ``.cache/huggingface/``).

huggingface_hub reads ``HF_ENDPOINT`` and ``HF_HUB_OFFLINE`` when it is first imported; ``endpoint``
here overrides the former per call (a mirror, or the fake Hub in the tests).
"""

from __future__ import annotations

import fcntl
import os
import re
import stat
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkfold.weights.errors import HubError, RevisionError, TokenFileError
from sparkfold.weights.progress import Progress

__all__ = [
    "RemoteFile",
    "RemoteSnapshot",
    "download",
    "exclusive",
    "forget_local_copy",
    "hub_offline",
    "is_commit",
    "read_token_file",
    "require_pin",
    "snapshot",
    "watch_partial_downloads",
]

_COMMIT = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class RemoteFile:
    """A file of a revision as the Hub lists it: ``sha256`` for LFS files, ``git_oid`` for the others."""

    path: str
    size: int
    sha256: str | None
    git_oid: str | None


@dataclass(frozen=True)
class RemoteSnapshot:
    repo: str
    revision: str  # as asked: a commit, or a branch/tag when moving revisions are allowed
    commit: str  # what it resolved to; every download uses this
    files: tuple[RemoteFile, ...]


def is_commit(revision: str) -> bool:
    return _COMMIT.fullmatch(revision) is not None


def require_pin(repo: str, revision: str, *, allow_moving: bool) -> None:
    if not is_commit(revision) and not allow_moving:
        raise RevisionError(
            f"{repo}: revision {revision!r} is a branch or tag, not a commit: pin the 40-hex commit "
            "(the Hub shows it under 'Files and versions') or pass --allow-moving-revision"
        )


def read_token_file(path: Path, warn: Callable[[str], None]) -> str:
    """The token in ``path`` (first line, stripped); warns when others may read the file."""
    try:
        mode = path.stat().st_mode
        token = path.read_text(encoding="utf-8").strip().splitlines()
    except FileNotFoundError:
        raise TokenFileError(f"{path}: no such token file: write a read token there (mode 0600)") from None
    except OSError as exc:
        raise TokenFileError(f"{path}: cannot read the token file ({exc.strerror})") from None
    if not token or not token[0].strip():
        raise TokenFileError(f"{path}: the token file is empty: write a read token there (mode 0600)")
    if stat.S_IMODE(mode) & 0o077:
        warn(f"warning: {path} is readable by others (mode {stat.S_IMODE(mode):04o}): chmod 600 {path}")
    return token[0].strip()


def hub_offline() -> bool:
    from huggingface_hub import is_offline_mode

    return is_offline_mode()


def _transport_errors() -> tuple[type[BaseException], ...]:
    """huggingface_hub's HTTP client raises its own transport errors (httpx2 in 2.x, httpx in 1.x)."""
    found: list[type[BaseException]] = [ConnectionError, TimeoutError]
    for name in ("httpx2", "httpx"):
        try:
            module = __import__(name)
        except ImportError:
            continue
        found.append(module.TransportError)
    return tuple(found)


def _expected_errors() -> tuple[type[BaseException], ...]:
    """What huggingface_hub raises for the Hub's answers and the network; anything else is a bug."""
    from huggingface_hub.errors import (
        EntryNotFoundError,
        FileMetadataError,
        HfHubHTTPError,
        OfflineModeIsEnabled,
    )

    return (HfHubHTTPError, OfflineModeIsEnabled, EntryNotFoundError, FileMetadataError, *_transport_errors())


def _hub_error(
    exc: BaseException, repo: str, revision: str, endpoint: str, token_file: str | None
) -> HubError | RevisionError:
    """One line for the operator; built from the error's type and status, never from its text."""
    from huggingface_hub.errors import (
        FileMetadataError,
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    # hf_hub_download wraps a failed HEAD (5xx, network) in "not in the local cache": use the cause
    while isinstance(exc, LocalEntryNotFoundError) and exc.__cause__ is not None:
        exc = exc.__cause__
    token_hint = f"the token in {token_file}" if token_file else "a token (--token-file)"
    if isinstance(exc, OfflineModeIsEnabled):
        return HubError(
            f"{repo}@{revision}: HF_HUB_OFFLINE is set: unset it to download, or copy the files in"
        )
    if isinstance(exc, GatedRepoError):
        return HubError(
            f"{repo} is gated: accept its terms on the model page with the account of {token_hint}, "
            "and give that account's read token"
        )
    if isinstance(exc, RevisionNotFoundError):
        return RevisionError(f"{repo} has no revision {revision!r} on {endpoint}: check the pinned commit")
    if isinstance(exc, RemoteEntryNotFoundError):
        return HubError(f"{repo}@{revision}: a listed file is gone from {endpoint}: run the fetch again")
    if isinstance(exc, RepositoryNotFoundError):
        return HubError(
            f"{repo} not found on {endpoint}, or not visible with {token_hint}: "
            "check the repo id and the token's access"
        )
    if isinstance(exc, HfHubHTTPError):
        status = exc.response.status_code if exc.response is not None else "?"
        if status == 401:
            return HubError(f"Hugging Face does not accept {token_hint}: write a valid read token there")
        return HubError(f"{repo}@{revision}: {endpoint} answered HTTP {status}: try again later")
    if isinstance(exc, FileMetadataError):
        return HubError(f"{endpoint} answered without file metadata: is HF_ENDPOINT a Hugging Face Hub?")
    if isinstance(exc, _transport_errors()):
        return HubError(
            f"cannot reach {endpoint} ({type(exc).__name__}): check the node's network, "
            "or set HF_ENDPOINT to a mirror"
        )
    return HubError(f"{repo}@{revision}: download failed ({type(exc).__name__}): run the fetch again")


def _endpoint(endpoint: str | None) -> str:
    from huggingface_hub import constants

    return (endpoint or constants.ENDPOINT).rstrip("/")


def snapshot(
    repo: str, revision: str, *, endpoint: str | None, token: str | None, token_file: str | None
) -> RemoteSnapshot:
    """The revision's commit and files (sizes, LFS sha256, git ids) from the Hub's metadata."""
    from huggingface_hub import HfApi

    where = _endpoint(endpoint)
    try:
        info = HfApi(endpoint=where, token=token).model_info(repo, revision=revision, files_metadata=True)
    except _expected_errors() as exc:
        raise _hub_error(exc, repo, revision, where, token_file) from None
    commit = info.sha or ""
    if not is_commit(commit) or (is_commit(revision) and commit != revision):
        raise HubError(
            f"{repo}@{revision}: {where} answered commit {commit!r}: is HF_ENDPOINT a Hugging Face Hub?"
        )
    if not info.siblings:
        raise HubError(
            f"{repo}@{commit}: the Hub lists no files for this commit: check the repo id and the pin"
        )
    files = []
    for sibling in info.siblings:
        lfs: Any = sibling.lfs
        size = lfs["size"] if lfs else sibling.size
        if size is None:
            raise HubError(f"{repo}@{commit}: the Hub listed {sibling.rfilename} without a size: try again")
        files.append(
            RemoteFile(sibling.rfilename, int(size), lfs["sha256"] if lfs else None, sibling.blob_id)
        )
    return RemoteSnapshot(repo, revision, commit, tuple(files))


@contextmanager
def exclusive(dest: Path) -> Iterator[None]:
    """Hold ``dest`` for one fetch; then clear partial files a killed run left (each is unique to its
    process and never resumed, so it only takes space)."""
    dest.mkdir(parents=True, exist_ok=True)
    fd = os.open(dest, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise HubError(
                f"{dest}: another fetch is writing here: wait for it to finish, or stop it"
            ) from None
        for part in (dest / ".cache" / "huggingface" / "download").rglob("*.incomplete"):
            part.unlink(missing_ok=True)
        yield
    finally:
        os.close(fd)


def forget_local_copy(dest: Path, path: str) -> None:
    """Delete a stale or corrupt file and huggingface_hub's record of it, so the next download refetches."""
    (dest / path).unlink(missing_ok=True)
    (dest / ".cache" / "huggingface" / "download" / f"{path}.metadata").unlink(missing_ok=True)


def download(
    snap: RemoteSnapshot,
    path: str,
    dest: Path,
    *,
    endpoint: str | None,
    token: str | None,
    token_file: str | None,
) -> None:
    """Fetch one file of the pinned commit into ``dest``.

    huggingface_hub resumes a transfer cut mid-file with a Range request, in the same run.
    """
    from huggingface_hub import hf_hub_download
    from huggingface_hub.utils.tqdm import disable_progress_bars

    disable_progress_bars()  # our own progress lines go to stderr instead of redrawn bars
    where = _endpoint(endpoint)
    try:
        hf_hub_download(snap.repo, path, revision=snap.commit, local_dir=dest, endpoint=where, token=token)
    except Exception as exc:
        raise _hub_error(exc, snap.repo, snap.commit, where, token_file) from None


@contextmanager
def watch_partial_downloads(
    dest: Path, progress: Progress, status: Callable[[], tuple[int, str]]
) -> Iterator[None]:
    """While inside, report the finished bytes and current file from ``status()``, plus the bytes of
    the partial files huggingface_hub is writing, once a second (``progress`` limits the lines)."""
    partial_dir = dest / ".cache" / "huggingface" / "download"
    stop = threading.Event()

    def partial_bytes() -> int:
        total = 0
        for part in partial_dir.rglob("*.incomplete"):
            try:
                total += part.stat().st_size
            except FileNotFoundError:
                continue
        return total

    def watch() -> None:
        while not stop.wait(1.0):
            finished, current = status()
            progress.update(finished + partial_bytes(), current)

    thread = threading.Thread(target=watch, name="sparkfold-download-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
