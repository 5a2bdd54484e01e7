"""What a JSON body will cost once parsed, judged from its bytes before it is parsed.

A request's size in memory after ``json.loads`` follows its shape, not its length: 40 MiB of
``[{}, {}, …]`` became 2.2 GB in the gateway, and parsing it held the event loop (the C parser
holds the GIL, so a thread would not have freed the loop either). Two numbers bound it, each
found at memchr speed without parsing:

- **text bytes**: the body less its ``data:`` URLs (pictures and videos, which the media limits
  bound), so a large picture does not count against the structure around it;
- **JSON values**: ``{``, ``[`` and ``,`` counted over the whole body, an upper bound (those inside
  strings count too; base64 has none of them). Only a body past the limit is counted again without
  its strings' insides, so that a long prompt of CSV or code (a 1,048,576-token window of numbers
  holds millions of commas) is not refused for its text: :func:`values_outside_strings` walks at
  most ``PRECISE_STRINGS`` strings with a regular expression (C speed between them); a body of
  more strings keeps the upper bound. Nothing in the standard library or the JSON parsers we ship
  counts a document's values without building them, hence this module.

Lists are further capped by the wire models (:mod:`sparkfold.protocol`) once parsed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sparkfold.units import MIB

__all__ = ["PRECISE_STRINGS", "BodyShape", "data_url_bytes", "values_outside_strings"]

_DATA_URL = b'"data:'
_STRING = re.compile(rb'"[^"\\]*+(?:\\.[^"\\]*+)*+"')  # a JSON string, escapes included
_STRUCTURE = (b"{", b"[", b",")
PRECISE_STRINGS = 65_536
"""Strings :func:`values_outside_strings` walks before it gives up (~50 ms of the event loop)."""


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


def _values(body: bytes, start: int = 0, end: int | None = None) -> int:
    stop = len(body) if end is None else end
    return sum(body.count(mark, start, stop) for mark in _STRUCTURE)


def values_outside_strings(body: bytes) -> int | None:
    """``{``, ``[`` and ``,`` of ``body`` outside its JSON strings, or ``None`` past
    ``PRECISE_STRINGS`` strings. In valid JSON a quote outside a string opens one, so the strings
    are found in order from the start; an invalid body fails its parse after this anyway."""
    inside = 0
    for seen, string in enumerate(_STRING.finditer(body)):
        if seen == PRECISE_STRINGS:
            return None
        inside += _values(body, string.start(), string.end())
    return _values(body) - inside


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
                    f"the request carries {text / MIB:.1f} MiB besides its pictures and videos; "
                    f"at most {self.max_text_bytes / MIB:g} MiB (api.max_text_body_mib): "
                    "send less text or fewer tools"
                )
        values = _values(body)
        if values > self.max_values:
            outside = values_outside_strings(body)
            values = values if outside is None else outside
        if values > self.max_values:
            return (
                f"the request has about {values} JSON values (objects, arrays and list items); at most "
                f"{self.max_values} (api.max_json_values): send fewer, or larger, items"
            )
        return None
