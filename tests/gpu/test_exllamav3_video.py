"""Video clips on the exllamav3 engine, against the decisive tiny GLM-5.3-Flash, in an engine core
and in the server's process (``any_client``: one engine load each, shared with the other tests).

Clips are encoded here with PyAV (MPEG-4 in MP4, 2 frames/s so every frame is sampled). The
shared engines run with ``VIDEO_LIMITS`` (80 frames, 32 tokens per clip): a 6-frame 64x64 clip is
3 temporal groups of 9 tokens; 70 frames (35 groups of at least one token) pass the token limit,
82 frames the frame limit. As for pictures (``test_exllamav3_engine.py``), a chat reply's first
token follows a control token, so the context decides it: that is how a clip changes a reply.
"""

from __future__ import annotations

import base64
import io
import random
from typing import Any

import httpx
import pytest
from gpu_engine import VIDEO_LIMITS, Results

QUESTIONS = ["What happens in this clip?", "Describe the video.", "Which colour comes first?"]


def frame(kind: str, size: int = 64) -> Any:
    """One RGB frame (a numpy array): a plain colour, or noise seeded by ``kind``."""
    import numpy as np

    colours = {"red": (220, 30, 30), "blue": (10, 20, 230), "green": (20, 200, 40)}
    if kind in colours:
        return np.full((size, size, 3), colours[kind], dtype=np.uint8)
    rng = random.Random(kind)
    return np.frombuffer(bytes(rng.randrange(256) for _ in range(size * size * 3)), dtype=np.uint8).reshape(
        size, size, 3
    )


def clip(kinds: list[str], size: int = 64) -> dict[str, Any]:
    """A ``video_url`` part: these frames as an MP4 at 2 frames/s."""
    import av

    buffer = io.BytesIO()
    with av.open(buffer, "w", format="mp4") as container:
        stream = container.add_stream("mpeg4", rate=2)
        stream.width = stream.height = size
        stream.pix_fmt = "yuv420p"
        for kind in kinds:
            picture = av.VideoFrame.from_ndarray(frame(kind, size), format="rgb24")
            for packet in stream.encode(picture):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    url = "data:video/mp4;base64," + base64.b64encode(buffer.getvalue()).decode()
    return {"type": "video_url", "video_url": {"url": url}}


STORY = ["red", "red", "blue", "blue", "noise-a", "noise-a"]
OTHER = ["noise-b", "noise-c", "green", "green", "noise-d", "noise-e"]


def ask(client: httpx.Client, *parts: dict[str, Any], question: str = QUESTIONS[0]) -> httpx.Response:
    content = [{"type": "text", "text": question}, *parts]
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 8, "temperature": 0}
    return client.post("/v1/chat/completions", json=body)


def reply(client: httpx.Client, *parts: dict[str, Any], question: str = QUESTIONS[0]) -> str:
    response = ask(client, *parts, question=question)
    assert response.status_code == 200, response.text
    return str(response.json()["choices"][0]["message"]["content"])


def where(request: pytest.FixtureRequest) -> str:
    return str(request.node.callspec.params["any_client"])


def replies(client: httpx.Client, *parts: dict[str, Any]) -> list[str]:
    """The replies to each of :data:`QUESTIONS` (a reply's first token is the context's choice, by
    a small margin: three questions give the clip three chances to show)."""
    return [reply(client, *parts, question=q) for q in QUESTIONS]


def test_different_clips_give_different_replies_and_a_clip_repeats(
    any_client: httpx.Client, results: Results, request: pytest.FixtureRequest
) -> None:
    story, other, plain = (
        replies(any_client, clip(STORY)),
        replies(any_client, clip(OTHER)),
        replies(any_client),
    )
    results.record(f"video_replies_{where(request)}", {"story": story, "other": other, "none": plain})
    assert replies(any_client, clip(STORY)) == story  # greedy with the same clip repeats
    assert story != plain  # the clip reached the model ...
    assert story != other  # ... through the vision tower, frame content and all


def test_reversing_the_frames_changes_the_reply(
    any_client: httpx.Client, results: Results, request: pytest.FixtureRequest
) -> None:
    forward, backward = replies(any_client, clip(STORY)), replies(any_client, clip(STORY[::-1]))
    results.record(f"video_reversed_{where(request)}", {"forward": forward, "backward": backward})
    assert forward != backward  # the same frames, another order: the groups reach the model in order


@pytest.mark.parametrize(
    ("frames", "says"),
    [
        (VIDEO_LIMITS["max_video_frames"] + 2, f"longer than {VIDEO_LIMITS['max_video_frames']} frames"),
        (70, f"more than {VIDEO_LIMITS['max_video_tokens']} per clip (max_video_tokens)"),  # 35 groups
    ],
    ids=["frames", "tokens"],
)
def test_a_clip_past_a_limit_is_a_400_naming_it_and_the_engine_serves_on(
    any_client: httpx.Client, frames: int, says: str
) -> None:
    before = reply(any_client, clip(STORY))
    response = ask(any_client, clip(["red", "blue"] * (frames // 2), size=32))
    assert response.status_code == 400, response.text
    assert says in response.json()["error"]["message"]
    assert any_client.get("/health").json()["ok"]
    assert reply(any_client, clip(STORY)) == before
