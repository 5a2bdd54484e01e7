"""Pictures and videos in chat requests: find, fetch, decode, budget, hand to the model's processor.

``image_url`` and ``video_url`` parts are read from user messages and tool results (in prompt
order, after normalisation). ``data:`` URLs always work; ``http(s)`` only when
:attr:`DecodeLimits.remote_urls` is on. Images decode with Pillow, videos with PyAV (sampled at
``video_fps``, at most ``max_video_frames``). Every limit that a request can break is a
:class:`~sparkfold.glm.errors.MediaError` (HTTP 400) naming the part and what to change. A model
without a vision tower must refuse pictures (:func:`require_vision`), never ignore them.

:func:`vision_inputs` runs the model's own image/video processors and expands each placeholder
(``<|image|>``, ``<|video|>``) in the rendered prompt to as many tokens as the picture takes.
"""

from __future__ import annotations

import base64
import binascii
import io
import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from PIL import Image

from sparkfold.glm.errors import MediaError, without_addresses
from sparkfold.glm.messages import IMAGE_PART_TYPES, VIDEO_PART_TYPES, normalise_messages
from sparkfold.glm.tokens import BEGIN_OF_IMAGE, END_OF_IMAGE, IMAGE, VIDEO
from sparkfold.units import MIB

__all__ = [
    "DecodeLimits",
    "DecodedMedia",
    "MediaPart",
    "Video",
    "collect_media",
    "load_media",
    "require_vision",
    "vision_inputs",
]

_DATA_URL = re.compile(r"^data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?P<params>(;[^;,]*)*?)(?P<b64>;base64)?,", re.I)


@dataclass(frozen=True)
class DecodeLimits:
    """What decoding one request's media may cost: counts, bytes, pixels, frames and vision tokens,
    and whether remote URLs are fetched (defaults follow the reference recipe's serving numbers)."""

    max_images: int = 8
    max_videos: int = 1
    max_image_bytes: int = 20 * MIB
    max_video_bytes: int = 64 * MIB
    max_image_pixels: int = 50_000_000
    max_total_pixels: int = 100_000_000
    max_image_tokens: int = 2048
    max_video_tokens: int = 16_384
    max_total_tokens: int = 65_536
    max_video_frames: int = 128
    video_fps: float = 2.0
    remote_urls: bool = False
    fetch_timeout_s: float = 10.0

    @classmethod
    def from_settings(cls, settings: Any) -> DecodeLimits:
        """From ``[engine.media]`` (:class:`sparkfold.config.MediaSettings`), MiB turned into bytes."""
        fields = settings.model_dump()
        fields["max_image_bytes"] = int(fields.pop("max_image_mib") * MIB)
        fields["max_video_bytes"] = int(fields.pop("max_video_mib") * MIB)
        return cls(**fields)


@dataclass(frozen=True)
class MediaPart:
    kind: str  # "image" | "video"
    url: str
    param: str  # the request field, e.g. messages[0].content[1]


@dataclass
class Video:
    frames: list[Image.Image]
    fps: float
    duration_s: float


@dataclass
class DecodedMedia:
    images: list[Image.Image] = field(default_factory=list)
    videos: list[Video] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.images or self.videos)


def _url_of(part: Mapping[str, Any], key: str) -> str:
    value = part.get(key)
    if isinstance(value, Mapping):
        value = value.get("url")
    return value if isinstance(value, str) else ""


def collect_media(messages: Sequence[Any]) -> list[MediaPart]:
    """Every picture and video of a request, in the order the prompt shows them."""
    found: list[MediaPart] = []
    for i, message in enumerate(normalise_messages(messages)):
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            kind = part.get("type")
            where = f"messages[{i}].content[{j}]"
            if kind in IMAGE_PART_TYPES:
                found.append(MediaPart("image", _url_of(part, kind) or _url_of(part, "image_url"), where))
            elif kind in VIDEO_PART_TYPES:
                found.append(MediaPart("video", _url_of(part, kind) or _url_of(part, "video_url"), where))
    return found


def require_vision(parts: Sequence[MediaPart], *, has_vision: bool, model: str = "this model") -> None:
    """Refuse pictures for a model that cannot see them (never ignore them)."""
    if parts and not has_vision:
        raise MediaError(
            f"{model} has no vision tower and cannot read images or videos; remove the "
            f"{parts[0].kind}_url parts or use a vision model",
            param=parts[0].param,
        )


def _fetch(part: MediaPart, limit: int, limits: DecodeLimits) -> bytes:
    import httpx

    data = bytearray()
    try:
        with httpx.stream("GET", part.url, timeout=limits.fetch_timeout_s, follow_redirects=True) as response:
            if response.status_code != 200:
                raise MediaError(f"fetching the {part.kind} gave HTTP {response.status_code}", part.param)
            for chunk in response.iter_bytes():
                data += chunk
                if len(data) > limit:
                    raise MediaError(_too_big(part, limit), part.param)
    except httpx.HTTPError as exc:
        raise MediaError(f"cannot fetch the {part.kind}: {without_addresses(str(exc))}", part.param) from None
    return bytes(data)


def _too_big(part: MediaPart, limit: int) -> str:
    return f"the {part.kind} is larger than {limit / MIB:g} MiB; send a smaller one"


def _payload(part: MediaPart, limits: DecodeLimits) -> bytes:
    limit = limits.max_image_bytes if part.kind == "image" else limits.max_video_bytes
    url = part.url.strip()
    match = _DATA_URL.match(url)
    if match:
        body = url[match.end() :]
        if not match.group("b64"):
            raise MediaError(f"{part.kind} data: URLs must be base64 encoded", part.param)
        if len(body) * 3 // 4 > limit:
            raise MediaError(_too_big(part, limit), part.param)
        try:
            return base64.b64decode(body, validate=True)
        except (binascii.Error, ValueError):
            raise MediaError(f"the {part.kind} data: URL is not valid base64", part.param) from None
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme in ("http", "https"):
        if not limits.remote_urls:
            raise MediaError(
                f"http(s) {part.kind} URLs are disabled on this server; send the {part.kind} as a data: URL",
                part.param,
            )
        return _fetch(part, limit, limits)
    if not url:
        raise MediaError(f"the {part.kind} part has no url", part.param)
    raise MediaError(
        f"unsupported {part.kind} URL scheme {scheme or url[:16]!r}; use a data: URL", part.param
    )


PIXELS_PER_TOKEN = 28 * 28
"""GLM-V's vision tower: 14-pixel patches merged 2 x 2 into one token."""
KEEP_FACTOR = 4
"""A decoded picture is kept at up to this many times the pixels of its token budget (the
processor resizes it to the budget anyway); a larger one is shrunk at once, so only one picture
at full size is ever held."""


def _open_image(part: MediaPart, data: bytes, limits: DecodeLimits) -> Image.Image:
    """The picture, opened lazily: its size comes from the header, nothing is decoded yet."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
    except (OSError, ValueError, Image.DecompressionBombWarning, Image.DecompressionBombError) as exc:
        raise MediaError(f"cannot decode the image: {without_addresses(str(exc))}", part.param) from None
    if image.width * image.height > limits.max_image_pixels:
        raise MediaError(
            f"the image has {image.width}x{image.height} pixels, more than {limits.max_image_pixels}",
            part.param,
        )
    return image


def _budget_images(opened: Sequence[tuple[MediaPart, Image.Image]], limits: DecodeLimits) -> None:
    """Refuse, from the headers alone, pictures that together pass the pixel or token budget."""
    pixels = sum(image.width * image.height for _, image in opened)
    if pixels > limits.max_total_pixels:
        raise MediaError(
            f"the images have {pixels} pixels together, more than {limits.max_total_pixels} per request; "
            "send fewer or smaller images",
            opened[-1][0].param,
        )
    tokens = sum(
        min(limits.max_image_tokens, -(-image.width * image.height // PIXELS_PER_TOKEN))
        for _, image in opened
    )
    if tokens > limits.max_total_tokens:
        raise MediaError(
            f"the images take about {tokens} tokens, more than {limits.max_total_tokens} per request; "
            "send fewer or smaller pictures",
            opened[-1][0].param,
        )


def _decode_image(part: MediaPart, image: Image.Image, limits: DecodeLimits) -> Image.Image:
    keep = KEEP_FACTOR * limits.max_image_tokens * PIXELS_PER_TOKEN
    try:
        if image.width * image.height > keep:
            scale = (keep / (image.width * image.height)) ** 0.5
            size = (max(1, int(image.width * scale)), max(1, int(image.height * scale)))
            image.draft("RGB", size)  # JPEG decodes at a fraction of its size; a no-op otherwise
            image.load()
            image = image.convert("RGB")
            image.thumbnail(size)
            return image
        image.load()
    except (OSError, ValueError, Image.DecompressionBombError) as exc:
        raise MediaError(f"cannot decode the image: {without_addresses(str(exc))}", part.param) from None
    return image.convert("RGB")


def _decode_video(part: MediaPart, data: bytes, limits: DecodeLimits) -> Video:
    try:
        import av
    except ImportError:  # an install without the exllamav3 extra's PyAV: say so, never a 500
        raise MediaError("this server cannot decode video (PyAV is not installed)", part.param) from None

    frames: list[Image.Image] = []
    try:
        with av.open(io.BytesIO(data), mode="r") as container:
            if not container.streams.video:
                raise MediaError("the video has no video stream", part.param)
            stream = container.streams.video[0]
            rate = float(stream.average_rate or 0) or 24.0
            step = max(1.0, rate / limits.video_fps)
            next_pick = 0.0
            for index, frame in enumerate(container.decode(stream)):
                if index + 1e-9 >= next_pick:
                    frames.append(frame.to_image().convert("RGB"))  # type: ignore[no-untyped-call]
                    next_pick += step
                    if len(frames) > limits.max_video_frames:
                        raise MediaError(
                            f"the video is longer than {limits.max_video_frames} frames at "
                            f"{limits.video_fps:g} frames/s (max_video_frames, video_fps); "
                            "send a shorter clip",
                            part.param,
                        )
            total = index + 1 if frames else 0  # frames decoded, picked or not
    except MediaError:
        raise
    except (av.FFmpegError, OSError, ValueError) as exc:
        raise MediaError(f"cannot decode the video: {without_addresses(str(exc))}", part.param) from None
    if not frames:
        raise MediaError("the video has no frames", part.param)
    return Video(frames=frames, fps=min(limits.video_fps, rate), duration_s=total / rate)


def load_media(parts: Sequence[MediaPart], limits: DecodeLimits | None = None) -> DecodedMedia:
    """Fetch and decode every part within ``limits``."""
    limits = limits or DecodeLimits()
    images = [p for p in parts if p.kind == "image"]
    videos = [p for p in parts if p.kind == "video"]
    if len(images) > limits.max_images:
        raise MediaError(f"{len(images)} images, at most {limits.max_images} per request", images[-1].param)
    if len(videos) > limits.max_videos:
        raise MediaError(f"{len(videos)} videos, at most {limits.max_videos} per request", videos[-1].param)
    opened = [(part, _open_image(part, _payload(part, limits), limits)) for part in images]
    _budget_images(opened, limits)  # before anything is decoded
    media = DecodedMedia()
    for part, image in opened:
        media.images.append(_decode_image(part, image, limits))
    for part in videos:
        media.videos.append(_decode_video(part, _payload(part, limits), limits))
    return media


def _video_structure(groups: int, per_group: int, video: Video, temporal: int) -> str:
    """What a video placeholder becomes: one image block per temporal group, with its time."""
    return "".join(
        f"{BEGIN_OF_IMAGE}{IMAGE * per_group}{END_OF_IMAGE}{g * temporal / video.fps:.1f} seconds"
        for g in range(groups)
    )


def _replace_each(text: str, placeholder: str, replacements: Sequence[str]) -> str:
    pieces = text.split(placeholder)
    if len(pieces) - 1 != len(replacements):
        raise MediaError(
            f"the prompt has {len(pieces) - 1} {placeholder} placeholders for {len(replacements)} inputs"
        )
    return pieces[0] + "".join(r + rest for r, rest in zip(replacements, pieces[1:], strict=True))


def vision_inputs(
    prompt: str,
    media: DecodedMedia,
    *,
    image_processor: Any,
    video_processor: Any = None,
    limits: DecodeLimits | None = None,
) -> tuple[str, dict[str, Any]]:
    """Run the model's processors; return the prompt with placeholders expanded and the tensors."""
    limits = limits or DecodeLimits()
    tensors: dict[str, Any] = {}
    total = 0
    if media.images:
        merge = int(image_processor.merge_size) ** 2
        out = image_processor(
            images=media.images, max_image_tokens=limits.max_image_tokens, return_tensors="pt"
        )
        counts = [int(thw.prod()) // merge for thw in out["image_grid_thw"]]
        total += sum(counts)
        prompt = _replace_each(prompt, IMAGE, [IMAGE * c for c in counts])
        tensors |= {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]}
    if media.videos:
        if video_processor is None:
            raise MediaError("this engine cannot process video (the model's video processor is unavailable)")
        merge = int(video_processor.merge_size) ** 2
        out = video_processor(
            videos=[v.frames for v in media.videos],
            max_image_tokens=limits.max_video_tokens,
            return_tensors="pt",
            return_metadata=True,
        )
        counts = [int(thw.prod()) // merge for thw in out["video_grid_thw"]]
        over = next((c for c in counts if c > limits.max_video_tokens), None)
        if over is not None:
            raise MediaError(
                f"the video takes {over} tokens, more than {limits.max_video_tokens} per clip "
                "(max_video_tokens); send a shorter clip",
                param="messages",
            )
        total += sum(counts)
        structures = [
            _video_structure(
                int(thw[0]), count // int(thw[0]), video, int(video_processor.temporal_patch_size)
            )
            for thw, count, video in zip(out["video_grid_thw"], counts, media.videos, strict=True)
        ]
        prompt = _replace_each(prompt, VIDEO, structures)
        tensors |= {
            "pixel_values_videos": out["pixel_values_videos"],
            "video_grid_thw": out["video_grid_thw"],
        }
    if total > limits.max_total_tokens:
        raise MediaError(
            f"the pictures take {total} tokens, more than {limits.max_total_tokens} per request; "
            "send fewer or smaller pictures",
            param="messages",
        )
    return prompt, tensors
