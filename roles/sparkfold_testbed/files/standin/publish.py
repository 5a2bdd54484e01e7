#!/usr/bin/env python3
"""Publish the TensorFold stand-in to the testbed's registry, as the recipe publishes its image.

    publish.py CONTEXT_DIR REGISTRY NAME TAG LABEL ARCH

Builds an image from the stand-in's context (the Python runtime tarball, ``fake_tensorfold.py`` and
the ``tensorfold`` command, the layout of ``standin.Dockerfile.j2``) without Docker, labelled
``tf.patches=LABEL`` as the recipe labels its images, and pushes it with the registry's HTTP API
(distribution's v2: blob uploads, then the manifest). Byte for byte deterministic: the same context
gives the same digest, and a re-run pushes nothing. Prints ``{"ref": "REGISTRY/NAME:TAG@sha256:…",
"digest": …, "changed": …}``; the testbed role writes the ref where the tensorfold inventory reads it.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import sys
import tarfile
import urllib.error
import urllib.request
from pathlib import Path

MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
CONFIG = "application/vnd.docker.container.image.v1+json"
LAYER = "application/vnd.docker.image.rootfs.diff.tar.gzip"


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def gzipped(data: bytes) -> bytes:
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", mtime=0, compresslevel=1) as stream:
        stream.write(data)
    return out.getvalue()


def tool_layer(context: Path) -> bytes:
    """The stand-in and its command at the Dockerfile's paths, owned by root, time 0."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for folder in ("opt", "opt/tensorfold-standin", "usr", "usr/local", "usr/local/bin"):
            entry = tarfile.TarInfo(folder)
            entry.type, entry.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(entry)
        for source, dest, mode in (
            ("fake_tensorfold.py", "opt/tensorfold-standin/fake_tensorfold.py", 0o644),
            ("tensorfold", "usr/local/bin/tensorfold", 0o755),
        ):
            data = (context / source).read_bytes()
            entry = tarfile.TarInfo(dest)
            entry.size, entry.mode = len(data), mode
            tar.addfile(entry, io.BytesIO(data))
    return out.getvalue()


def request(
    method: str, url: str, data: bytes | None = None, kind: str | None = None
) -> tuple[int, dict[str, str]]:
    sent = urllib.request.Request(url, data=data, method=method)
    if kind:
        sent.add_header("Content-Type", kind)
    if method == "HEAD" and "/manifests/" in url:
        sent.add_header("Accept", MANIFEST)
    try:
        with urllib.request.urlopen(sent, timeout=120) as answer:
            return answer.status, dict(answer.headers)
    except urllib.error.HTTPError as exc:
        if method == "HEAD" and exc.code == 404:
            return 404, {}
        raise SystemExit(
            f"{method} {url}: HTTP {exc.code} {exc.read().decode(errors='replace')[:300]}"
        ) from None


def push_blob(base: str, data: bytes) -> None:
    digest = sha256(data)
    if request("HEAD", f"{base}/blobs/{digest}")[0] == 200:
        return
    _, headers = request("POST", f"{base}/blobs/uploads/", b"")
    location = headers["Location"]
    if location.startswith("/"):
        location = base.split("/v2/")[0] + location
    request(
        "PUT", f"{location}{'&' if '?' in location else '?'}digest={digest}", data, "application/octet-stream"
    )


def main(context_dir: str, registry: str, name: str, tag: str, label: str, arch: str) -> None:
    context = Path(context_dir)
    [runtime] = sorted(context.glob("python3-*.tar"))
    layers = [runtime.read_bytes(), tool_layer(context)]
    compressed = [gzipped(layer) for layer in layers]
    config = json.dumps(
        {
            "architecture": arch,
            "os": "linux",
            "created": "1970-01-01T00:00:00Z",
            "history": [
                {
                    "created": "1970-01-01T00:00:00Z",
                    "created_by": "the Python runtime cut from the node rootfs",
                },
                {"created": "1970-01-01T00:00:00Z", "created_by": "the stand-in as tensorfold"},
            ],
            "config": {
                "Env": ["PATH=/usr/local/bin:/usr/bin"],
                "WorkingDir": "/tmp",
                "Labels": {"tf.patches": label},
            },
            "rootfs": {"type": "layers", "diff_ids": [sha256(layer) for layer in layers]},
        },
        sort_keys=True,
    ).encode()
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": MANIFEST,
            "config": {"mediaType": CONFIG, "size": len(config), "digest": sha256(config)},
            "layers": [
                {"mediaType": LAYER, "size": len(blob), "digest": sha256(blob)} for blob in compressed
            ],
        },
        sort_keys=True,
    ).encode()
    digest = sha256(manifest)
    base = f"http://{registry}/v2/{name}"
    there = request("HEAD", f"{base}/manifests/{digest}")[0] == 200
    if not there:
        for blob in [config, *compressed]:
            push_blob(base, blob)
    # The tag too (a registry wiped since keeps the digest only when pushed again).
    request("PUT", f"{base}/manifests/{tag}", manifest, MANIFEST)
    print(json.dumps({"ref": f"{registry}/{name}:{tag}@{digest}", "digest": digest, "changed": not there}))


if __name__ == "__main__":
    if len(sys.argv) != 7:
        raise SystemExit(__doc__)
    main(*sys.argv[1:])
