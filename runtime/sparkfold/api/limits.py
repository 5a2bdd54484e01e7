"""Request limits the gateway enforces before anything reaches the engine.

Each check returns a :class:`~sparkfold.api.errors.ClientError` naming the field, the limit and
the setting that holds it, or ``None``. Media are counted in chat content parts of every type
the engine reads as a picture or a video (``sparkfold.glm.messages.IMAGE_PART_TYPES`` and
``VIDEO_PART_TYPES``: one list for both sides, so no spelling slips past the limits); a ``data:``
URL's size is its decoded size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sparkfold.api.errors import ClientError, LimitExceeded
from sparkfold.config import ApiSettings
from sparkfold.glm.messages import IMAGE_PART_TYPES, VIDEO_PART_TYPES
from sparkfold.units import MIB

__all__ = ["UploadLimits", "check_media"]


@dataclass(frozen=True)
class UploadLimits:
    """How many pictures and videos a request may carry, and how many bytes each (the ``[api]``
    settings, checked at the gateway before the engine sees the request); the engine's own decode
    budget is :class:`sparkfold.glm.media.DecodeLimits`."""

    max_images: int
    max_image_bytes: int
    max_videos: int
    max_video_bytes: int

    @classmethod
    def of(cls, api: ApiSettings) -> UploadLimits:
        return cls(
            max_images=api.max_images,
            max_image_bytes=int(api.max_image_mib * MIB),
            max_videos=api.max_videos,
            max_video_bytes=int(api.max_video_mib * MIB),
        )


def _data_url_bytes(url: str) -> int | None:
    if not url.startswith("data:"):
        return None
    header, _, payload = url.partition(",")
    if ";base64" not in header:
        return len(payload)
    payload = payload.strip()
    return len(payload) * 3 // 4 - payload[-2:].count("=")


def _part_url(part: dict[str, Any], key: str) -> str:
    value = part.get(key)
    if isinstance(value, dict):
        value = value.get("url")
    return value if isinstance(value, str) else ""


def check_media(messages: Sequence[Any], limits: UploadLimits) -> ClientError | None:
    """Count and size the images and videos of chat ``messages`` (objects with ``content``)."""
    counts = {"image": 0, "video": 0}
    for i, message in enumerate(messages):
        content = getattr(message, "content", None)
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in IMAGE_PART_TYPES and kind not in VIDEO_PART_TYPES:
                continue
            media = "image" if kind in IMAGE_PART_TYPES else "video"
            counts[media] += 1
            where = f"messages[{i}].content[{j}].{kind}"
            size = _data_url_bytes(_part_url(part, kind) or _part_url(part, f"{media}_url"))
            count_limit, size_limit = {
                "image": (limits.max_images, limits.max_image_bytes),
                "video": (limits.max_videos, limits.max_video_bytes),
            }[media]
            count_key, size_key, noun = f"api.max_{media}s", f"api.max_{media}_mib", f"{media}s"
            if counts[media] > count_limit:
                return LimitExceeded(
                    f"too many {noun}: at most {count_limit} per request ({count_key}); "
                    f"{where} is number {counts[media]}",
                    param=where,
                )
            if size is not None and size > size_limit:
                return LimitExceeded(
                    f"{where} is {size / MIB:.1f} MiB; at most {size_limit / MIB:g} MiB each "
                    f"({size_key}): send it smaller",
                    param=where,
                )
    return None
