"""API keys: loaded from a file, compared in constant time, reloaded on SIGHUP.

The file holds one key per line, either the key itself or ``sha256:<64 hex digits>`` (the
SHA-256 of the key, so the file need not hold the secret). Blank lines and ``#`` comments are
skipped. Only digests are kept in memory; a presented key is hashed and compared against every
digest with :func:`hmac.compare_digest`, so timing says nothing about which key nearly matched.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from pathlib import Path

__all__ = ["KeyFileError", "KeyStore", "hash_key", "tenant_of"]

log = logging.getLogger(__name__)

_HASH_PREFIX = "sha256:"


class KeyFileError(ValueError):
    """The keys file cannot be read or has a malformed line (the message names the line)."""


def hash_key(key: str) -> str:
    """The ``sha256:<hex>`` line that stands for ``key`` in a keys file."""
    return _HASH_PREFIX + hashlib.sha256(key.encode()).hexdigest()


def tenant_of(key: str) -> str:
    """Who a key stands for, as far as stored objects go: its SHA-256 (never the key itself)."""
    return hashlib.sha256(key.encode()).hexdigest()


def _parse(text: str, source: str) -> list[bytes]:
    digests: list[bytes] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith(_HASH_PREFIX):
            hexpart = line.removeprefix(_HASH_PREFIX).lower()
            try:
                digest = bytes.fromhex(hexpart)
            except ValueError:
                digest = b""
            if len(digest) != 32:
                raise KeyFileError(f"{source}:{number}: 'sha256:' must be followed by 64 hex digits")
            digests.append(digest)
        else:
            digests.append(hashlib.sha256(line.encode()).digest())
    return digests


class KeyStore:
    """The accepted keys; empty means none configured."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._digests: list[bytes] = []
        self.reload()

    def __repr__(self) -> str:
        return f"KeyStore(path={str(self.path)!r}, keys={len(self._digests)})"

    def __len__(self) -> int:
        return len(self._digests)

    def reload(self) -> int:
        """Read the file again; on error keep the keys in force and raise. Returns the key count."""
        if self.path is None:
            self._digests = []
            return 0
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            text = ""
        except OSError as exc:
            raise KeyFileError(f"{self.path}: cannot read: {exc.strerror or exc}") from None
        self._digests = _parse(text, str(self.path))
        log.info("api keys loaded", extra={"path": str(self.path), "keys": len(self._digests)})
        return len(self._digests)

    def accepts(self, presented: str) -> bool:
        digest = hashlib.sha256(presented.encode()).digest()
        found = False
        for known in self._digests:
            found |= hmac.compare_digest(digest, known)
        return found
