"""What a JSON body will cost once parsed, judged from its bytes before it is parsed.

A request's size in memory after ``json.loads`` follows its shape, not its length: 40 MiB of
``[{}, {}, …]`` became 2.2 GB in the gateway, and parsing it held the event loop (the C parser
holds the GIL, so a thread would not have freed the loop either). Two numbers bound it, each
found at memchr speed without parsing:

- **text bytes**: the body less its ``data:`` URLs (pictures and videos, which the media limits
  bound), so a large picture does not count against the structure around it;
- **JSON values**: ``{``, ``[`` and ``,`` counted over the whole body. Those inside strings count
  too, so this is an upper bound (base64 has none of them).

Lists are further capped by the wire models (:mod:`sparkfold.protocol`) once parsed.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BodyShape", "data_url_bytes"]

_DATA_URL = b'"data:'


def data_url_bytes(body: bytes) -> int:
    """Bytes of the JSON strings in ``body`` that are ``data:`` URLs (their quotes included)."""
    total = 0
    start = body.find(_DATA_URL)
    while start != -1:
        end = body.find(b'"', start + len(_DATA_URL))
        if end == -1:
            break
        total += end + 1 - start  # a data URL has no escaped quote: base64 or percent-encoding
        start = body.find(_DATA_URL, end + 1)
    return total


@dataclass(frozen=True)
class BodyShape:
    max_text_bytes: int
    max_values: int

    def check(self, body: bytes) -> str | None:
        """Why ``body`` is refused (naming the setting), or ``None``."""
        if len(body) > self.max_text_bytes:
            text = len(body) - data_url_bytes(body)
            if text > self.max_text_bytes:
                return (
                    f"the request carries {text / (1 << 20):.1f} MiB besides its pictures and videos; "
                    f"at most {self.max_text_bytes / (1 << 20):g} MiB (api.max_text_body_mib): "
                    "send less text or fewer tools"
                )
        values = body.count(b"{") + body.count(b"[") + body.count(b",")
        if values > self.max_values:
            return (
                f"the request has about {values} JSON values (objects, arrays and list items); at most "
                f"{self.max_values} (api.max_json_values): send fewer, or larger, items"
            )
        return None
