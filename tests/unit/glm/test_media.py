"""Pictures and videos: found in prompt order, decoded, budgeted, refused by blind models."""

from __future__ import annotations

import base64
import io
import re
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from sparkfold.glm.errors import MediaError
from sparkfold.glm.media import DecodeLimits, collect_media, load_media, require_vision, vision_inputs
from sparkfold.glm.render import PromptRenderer


def png(width: int = 40, height: int = 30, colour: tuple[int, int, int] = (200, 10, 10)) -> str:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), colour).save(buffer, "PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def mp4(frames: int = 8, rate: int = 4) -> str:
    import av
    import numpy as np

    buffer = io.BytesIO()
    with av.open(buffer, "w", format="mp4") as container:
        stream = container.add_stream("mpeg4", rate=rate)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        for i in range(frames):
            image = np.full((48, 64, 3), i * 20, dtype=np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return "data:video/mp4;base64," + base64.b64encode(buffer.getvalue()).decode()


def image_part(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def test_parts_are_found_in_prompt_order_including_tool_results() -> None:
    messages = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "a"}, image_part("data:image/png;base64,AA==")],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "1", "function": {"name": "shot", "arguments": "{}"}},
                {"id": "2", "function": {"name": "clip", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "2", "content": [{"type": "video_url", "video_url": {"url": "v"}}]},
        {"role": "tool", "tool_call_id": "1", "content": [image_part("i2")]},
    ]
    parts = collect_media(messages)
    assert [(p.kind, p.url) for p in parts] == [
        ("image", "data:image/png;base64,AA=="),
        ("image", "i2"),
        ("video", "v"),
    ]
    assert parts[1].param == "messages[2].content[0]"  # results follow the call order


def test_images_and_videos_decode() -> None:
    media = load_media(
        collect_media(
            [
                {
                    "role": "user",
                    "content": [
                        image_part(png()),
                        {"type": "video_url", "video_url": {"url": mp4(frames=8, rate=4)}},
                    ],
                }
            ]
        )
    )
    assert media.images[0].size == (40, 30) and media.images[0].mode == "RGB"
    video = media.videos[0]
    assert len(video.frames) == 4 and video.fps == 2.0 and video.duration_s == pytest.approx(2.0)


@pytest.mark.parametrize(
    ("url", "limits", "message"),
    [
        ("https://example.org/cat.png", DecodeLimits(), r"http\(s\) image URLs are disabled"),
        ("file:///etc/passwd", DecodeLimits(), "unsupported image URL scheme"),
        ("data:image/png;base64,!!!", DecodeLimits(), "not valid base64"),
        ("data:image/png,rawbytes", DecodeLimits(), "must be base64"),
        (
            "data:image/png;base64," + base64.b64encode(b"not an image").decode(),
            DecodeLimits(),
            "cannot decode",
        ),
        (png(), DecodeLimits(max_image_bytes=10), "larger than"),
        (png(300, 300), DecodeLimits(max_image_pixels=1000), "pixels"),
        ("", DecodeLimits(), "has no url"),
    ],
)
def test_bad_images_are_clear_errors(url: str, limits: DecodeLimits, message: str) -> None:
    parts = collect_media([{"role": "user", "content": [image_part(url)]}])
    with pytest.raises(MediaError, match=message) as error:
        load_media(parts, limits)
    assert error.value.param == "messages[0].content[0]" and error.value.status == 400
    assert not re.search(r"0x[0-9a-fA-F]{6,}", error.value.message), (
        error.value.message
    )  # main: PIL's BytesIO


def test_counts_and_frames_are_limited() -> None:
    parts = collect_media([{"role": "user", "content": [image_part(png()), image_part(png())]}])
    with pytest.raises(MediaError, match="2 images, at most 1"):
        load_media(parts, DecodeLimits(max_images=1))
    video = collect_media(
        [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": mp4(12, 4)}}]}]
    )
    with pytest.raises(MediaError, match="longer than 3 frames"):
        load_media(video, DecodeLimits(max_video_frames=3))


def test_a_model_without_vision_refuses_pictures() -> None:
    parts = collect_media([{"role": "user", "content": [image_part(png())]}])
    with pytest.raises(MediaError, match="has no vision tower") as error:
        require_vision(parts, has_vision=False, model="SmolLM2")
    assert error.value.param == "messages[0].content[0]"
    require_vision(parts, has_vision=True)
    require_vision([], has_vision=False)


def test_the_model_processor_expands_placeholders_within_budget(tiny_glm: Path) -> None:
    from transformers import AutoImageProcessor

    processor = AutoImageProcessor.from_pretrained(str(tiny_glm))
    messages = [
        {
            "role": "user",
            "content": [image_part(png(100, 60)), {"type": "text", "text": "and"}, image_part(png(30, 30))],
        }
    ]
    prompt = PromptRenderer().render(messages)
    media = load_media(collect_media(messages))
    text, tensors = vision_inputs(prompt, media, image_processor=processor)
    counts = [int(t.prod()) // processor.merge_size**2 for t in tensors["image_grid_thw"]]
    assert text.count("<|image|>") == sum(counts) and all(c >= 16 for c in counts)
    assert text.count("<|begin_of_image|>") == 2 and tensors["pixel_values"].shape[0] == sum(counts) * 4
    with pytest.raises(MediaError, match="more than 20 per request"):
        vision_inputs(prompt, media, image_processor=processor, limits=DecodeLimits(max_total_tokens=20))
    with pytest.raises(MediaError, match="video processor is unavailable"):
        video_media = load_media(
            collect_media([{"role": "user", "content": [{"type": "video_url", "video_url": {"url": mp4()}}]}])
        )
        vision_inputs("<|video|>", video_media, image_processor=processor, video_processor=None)


def test_limits_come_from_the_engine_settings() -> None:
    from sparkfold.config import MediaSettings

    limits = DecodeLimits.from_settings(MediaSettings(max_image_mib=1.5, remote_urls=True, max_images=2))
    assert (limits.max_image_bytes, limits.remote_urls, limits.max_images) == (1572864, True, 2)
    assert limits.max_video_bytes == 64 * 1024 * 1024


def _count_decodes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    decoded: list[int] = []
    load = Image.Image.load

    def counting(self: Image.Image) -> Any:
        decoded.append(self.width * self.height)
        return load(self)

    monkeypatch.setattr(Image.Image, "load", counting)
    monkeypatch.setattr("PIL.ImageFile.ImageFile.load", counting)
    return decoded


def _request(*urls: str) -> list[Any]:
    parts = [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    return collect_media([{"role": "user", "content": parts}])


def test_pictures_past_the_pixel_budget_are_refused_from_their_headers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    request = _request(*[png(300, 300)] * 3)
    decoded = _count_decodes(monkeypatch)
    with pytest.raises(MediaError, match="pixels together"):
        load_media(request, DecodeLimits(max_total_pixels=200_000))
    assert decoded == []  # nothing was decoded


def test_pictures_past_the_token_budget_are_refused_from_their_headers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    request = _request(png(280, 280), png(280, 280))
    decoded = _count_decodes(monkeypatch)
    with pytest.raises(MediaError, match="about 200 tokens"):
        load_media(request, DecodeLimits(max_total_tokens=150))
    assert decoded == []


def test_a_large_picture_is_kept_near_its_token_budget() -> None:
    media = load_media(_request(png(3000, 2000)), DecodeLimits(max_image_tokens=64))
    [image] = media.images
    assert image.width * image.height <= 4 * 64 * 28 * 28 and image.width / image.height == pytest.approx(
        1.5, 0.02
    )
