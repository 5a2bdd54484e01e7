"""A Hugging Face Hub on loopback with just the routes huggingface_hub uses to fetch a model.

Standard library only. Routes (what ``HfApi.model_info(files_metadata=True)`` and ``hf_hub_download``
call):

``GET  /api/models/{org}/{name}/revision/{rev}``  the commit and its files (size, blobId, lfs)
``HEAD|GET /{org}/{name}/resolve/{rev}/{path}``  small files: 200 with ``ETag`` (git blob id) and
                                                ``X-Repo-Commit``; LFS files: 302 to the CDN host
                                                with ``X-Linked-Etag`` (sha256) and ``X-Linked-Size``
``GET  /cdn/{sha256}``                          the LFS content, with ``Range`` (206) for resumes

The CDN is the same server reached as ``localhost`` instead of ``127.0.0.1``: another host, as on the
real Hub, so huggingface_hub does not follow the redirect on HEAD and drops the token on the download.
``host`` and ``cdn_host`` serve it elsewhere (the testbed's bridge address, for its nodes).

Faults, set on the :class:`FakeHub` between requests: ``cut_once[path] = n`` sends only n bytes of
that file's next download, then closes the connection; ``stall_once[path] = n`` sends n bytes, then
waits (at most 60 s) for ``release`` to be set before closing; ``fail_get`` answers 500 to downloads
of those paths; ``plain_resolve`` answers resolve requests for those paths without the Hub's headers
(as a plain web server would). ``requests`` logs every request as ``(method, path, range, authorization)``.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

LFS_MIN_BYTES = 1024  # files this large are stored in LFS (real repos: *.safetensors and friends)


def git_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class FakeRepo:
    repo_id: str
    files: dict[str, bytes]
    commit: str = "c0ffee" + "0" * 34
    branches: dict[str, str] = field(default_factory=dict)
    token: str | None = None  # set: a gated repo; downloads need "Authorization: Bearer <token>"

    def __post_init__(self) -> None:
        self.branches.setdefault("main", self.commit)

    def resolve(self, revision: str) -> str | None:
        if revision == self.commit:
            return self.commit
        return self.branches.get(revision)

    def is_lfs(self, path: str) -> bool:
        return len(self.files[path]) >= LFS_MIN_BYTES

    def sibling(self, path: str) -> dict[str, Any]:
        data = self.files[path]
        entry: dict[str, Any] = {"rfilename": path, "size": len(data), "blobId": git_oid(data)}
        if self.is_lfs(path):
            sha = hashlib.sha256(data).hexdigest()
            pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha}\nsize {len(data)}\n"
            entry["blobId"] = git_oid(pointer.encode())
            entry["size"] = len(pointer)
            entry["lfs"] = {"sha256": sha, "size": len(data), "pointerSize": len(pointer)}
        return entry


class FakeHub:
    def __init__(self, *repos: FakeRepo, host: str = "127.0.0.1", cdn_host: str = "localhost") -> None:
        self.repos = {r.repo_id: r for r in repos}
        self.cut_once: dict[str, int] = {}
        self.stall_once: dict[str, int] = {}
        self.stalled = threading.Event()  # set while a stalled transfer waits
        self.release = threading.Event()
        self.fail_get: set[str] = set()
        self.plain_resolve: set[str] = set()
        self.requests: list[tuple[str, str, str | None, str | None]] = []
        self._server = ThreadingHTTPServer((host, 0), _handler(self))
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self.url = f"http://{host}:{self.port}"
        self.cdn = f"http://{cdn_host}:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> FakeHub:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def downloads(self, path: str) -> list[tuple[str, str, str | None, str | None]]:
        """GET requests that carried ``path``'s content (resolve for small files, CDN for LFS)."""
        shas = {hashlib.sha256(r.files[path]).hexdigest() for r in self.repos.values() if path in r.files}
        cdn = {f"/cdn/{sha}" for sha in shas}
        return [
            req
            for req in self.requests
            if req[0] == "GET"
            and (
                req[1] in cdn
                or ("/resolve/" in req[1] and req[1].split("/resolve/", 1)[1].split("/", 1)[1] == path)
            )
        ]

    def blob(self, sha: str) -> tuple[str, bytes] | None:
        for repo in self.repos.values():
            for path, data in repo.files.items():
                if hashlib.sha256(data).hexdigest() == sha:
                    return path, data
        return None


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

        def do_HEAD(self) -> None:
            self._route(head=True)

        def do_GET(self) -> None:
            self._route(head=False)

        def _route(self, *, head: bool) -> None:
            path = urlsplit(self.path).path
            hub.requests.append(
                (self.command, path, self.headers.get("Range"), self.headers.get("Authorization"))
            )
            parts = path.strip("/").split("/")
            if parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] == "revision":
                return self._info("/".join(parts[2:4]), unquote("/".join(parts[5:])))
            if len(parts) >= 5 and parts[2] == "resolve":
                return self._resolve("/".join(parts[:2]), unquote(parts[3]), "/".join(parts[4:]), head)
            if len(parts) == 2 and parts[0] == "cdn" and (found := hub.blob(parts[1])) is not None:
                return self._content(*found, head=head, headers={})
            self._error(404, "EntryNotFound")

        def _error(self, status: int, code: str | None, message: str | None = None) -> None:
            body = json.dumps({"error": message or code or "error"}).encode()
            self.send_response(status)
            if code:
                self.send_header("X-Error-Code", code)
            if message:
                self.send_header("X-Error-Message", message)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _repo(self, repo_id: str, revision: str) -> tuple[FakeRepo, str] | None:
            repo = hub.repos.get(repo_id)
            if repo is None:
                self._error(401, "RepoNotFound")
                return None
            commit = repo.resolve(revision)
            if commit is None:
                self._error(404, "RevisionNotFound")
                return None
            return repo, commit

        def _info(self, repo_id: str, revision: str) -> None:
            found = self._repo(repo_id, revision)
            if found is None:
                return
            repo, commit = found
            siblings = [repo.sibling(p) for p in sorted(repo.files)]
            body = json.dumps({"id": repo_id, "sha": commit, "siblings": siblings}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _resolve(self, repo_id: str, revision: str, path: str, head: bool) -> None:
            found = self._repo(repo_id, revision)
            if found is None:
                return
            repo, commit = found
            auth = self.headers.get("Authorization")
            if repo.token is not None and auth is None:
                return self._error(401, "GatedRepo")
            if repo.token is not None and auth != f"Bearer {repo.token}":
                return self._error(401, None, "Invalid credentials in Authorization header")
            if path not in repo.files:
                return self._error(404, "EntryNotFound")
            sibling = repo.sibling(path)
            if path in hub.plain_resolve:
                return self._content(path, repo.files[path], head=head, headers={})
            if not repo.is_lfs(path):
                headers = {"ETag": f'"{sibling["blobId"]}"', "X-Repo-Commit": commit}
                return self._content(path, repo.files[path], head=head, headers=headers)
            sha = sibling["lfs"]["sha256"]
            self.send_response(302)
            self.send_header("Location", f"{hub.cdn}/cdn/{sha}")
            self.send_header("ETag", f'"{sibling["blobId"]}"')
            self.send_header("X-Linked-Etag", f'"{sha}"')
            self.send_header("X-Linked-Size", str(len(repo.files[path])))
            self.send_header("X-Repo-Commit", commit)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def _content(self, path: str, data: bytes, *, head: bool, headers: dict[str, str]) -> None:
            if not head and path in hub.fail_get:
                return self._error(500, None)
            start = 0
            if (wanted := self.headers.get("Range")) and wanted.startswith("bytes="):
                start = int(wanted.removeprefix("bytes=").split("-")[0])
            body = data[start:]
            self.send_response(206 if start else 200)
            for name, value in headers.items():
                self.send_header(name, value)
            if start:
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if head:
                return
            cut = hub.cut_once.pop(path, None)
            stall = hub.stall_once.pop(path, None)
            if cut is not None or stall is not None:
                self.wfile.write(body[: cut if cut is not None else stall])
                self.wfile.flush()
                if stall is not None:
                    hub.stalled.set()
                    hub.release.wait(60)
                self.close_connection = True
                return
            self.wfile.write(body)

    return Handler
