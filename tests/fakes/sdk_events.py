"""What the SDKs' stream helpers hand a client, read the way tests compare them."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def input_json_pieces(events: Iterable[Any]) -> list[str]:
    """The ``partial_json`` of every Anthropic ``input_json_delta`` event, in order."""
    return [
        e.delta.partial_json
        for e in events
        if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
    ]
