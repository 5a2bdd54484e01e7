"""Reasoning sealed so that it comes back unchanged: Responses ``encrypted_content``, Messages
thinking ``signature``.

A stateless client sends the model's reasoning back on the next turn as an opaque blob the server
wrote: a Responses client (``store: false`` with ``include: ["reasoning.encrypted_content"]``, as
Codex runs) in a reasoning item's ``encrypted_content`` (openai SDK:
``types/responses/response_reasoning_item.py``), a Messages client in a thinking block's
``signature`` (anthropic SDK: ``types/thinking_block.py``), the only place the reasoning is left
when it asked for ``thinking.display: "omitted"``. This gateway keeps nothing either: the blob is
``sf1.<payload>.<tag>``, the payload the base64 of ``{"k": key id, "t": text}`` and the tag its
HMAC-SHA256 under a key drawn at random when the gateway starts. It is signed, not encrypted:
what it guards is that the reasoning put back into the prompt is what the model wrote.

Opening a blob gives its text; a blob that is not one, or whose tag does not match, is a 400
(:class:`~sparkfold.api.errors.InvalidRequest`); a well-formed blob of another key (a gateway
start before this one) gives ``None``: the caller drops that reasoning, as an item without any.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets

from sparkfold.api.errors import InvalidRequest

__all__ = ["ReasoningSeal"]

_PREFIX = "sf1"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii").rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class ReasoningSeal:
    """Seals and opens reasoning text with this gateway start's key."""

    def __init__(self, key: bytes | None = None) -> None:
        self._key = key if key is not None else secrets.token_bytes(32)
        self.key_id = hashlib.sha256(self._key).hexdigest()[:16]

    def __repr__(self) -> str:
        return f"ReasoningSeal(key_id={self.key_id!r})"  # never the key

    def _tag(self, payload: bytes) -> bytes:
        return hmac.new(self._key, payload, hashlib.sha256).digest()

    @staticmethod
    def is_sealed(blob: object) -> bool:
        """Whether ``blob`` has this server's form (another's, e.g. Anthropic's signatures, has not)."""
        return isinstance(blob, str) and blob.startswith(f"{_PREFIX}.")

    def seal(self, text: str) -> str:
        payload = json.dumps({"k": self.key_id, "t": text}, ensure_ascii=False).encode()
        return f"{_PREFIX}.{_b64(payload)}.{_b64(self._tag(payload))}"

    def open(self, blob: object, where: str) -> str | InvalidRequest | None:
        """The text sealed in ``blob``; ``None`` when another gateway start sealed it."""
        bad = InvalidRequest(
            f"{where}: not an encrypted_content this server wrote (altered, or from another server); "
            "send the reasoning item back as it was returned, or leave encrypted_content out",
            param=where,
        )
        if not isinstance(blob, str):
            return bad
        prefix, _, rest = blob.partition(".")
        encoded, _, tag_text = rest.partition(".")
        try:
            payload, tag = _unb64(encoded), _unb64(tag_text)
            fields = json.loads(payload)
        except (binascii.Error, ValueError):
            return bad
        if prefix != _PREFIX or not isinstance(fields, dict) or not isinstance(fields.get("t"), str):
            return bad
        if fields.get("k") != self.key_id:
            return None
        if not hmac.compare_digest(tag, self._tag(payload)):
            return bad
        text: str = fields["t"]
        return text
