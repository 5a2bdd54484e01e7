"""Video clips on the exllamav3 engine, without a GPU: a fake vision tower that takes a clip as
exllamav3's ``Glm5NextVisionModel`` does (a list of frames: one patch tensor, grid ``(frames / 2, h, w)``).

Measuring (the prompt's placeholder runs), the prompt's video structure, the clip limits, the
engine thread's one embedding per clip spliced group by group, and the same through an engine
core over the real wire. ``tests/gpu/test_exllamav3_video.py`` runs the real tower.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from multiprocessing.connection import Connection
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from tests.unit.engines.test_core_pictures import CoreThread
from tests.unit.engines.test_exllamav3 import FAKE_EXL, FakeGenerator, FakeVision, with_vision
from tests.unit.glm.test_media import mp4

from sparkfold.engines import exllamav3 as backend
from sparkfold.engines.core import main as core_main
from sparkfold.engines.core.client import CoreClient
from sparkfold.engines.exllamav3 import vision as vision_module
from sparkfold.engines.generator import SamplingParams
from sparkfold.glm.errors import MediaError
from sparkfold.glm.media import DecodeLimits, collect_media, load_media, vision_inputs
from sparkfold.glm.render import PromptRenderer

IMAGE, BEGIN_VIDEO, END_VIDEO = 7, 8, 9  # as test_exllamav3's PictureTok has them


class ClipVision(FakeVision):
    """A picture is an int (as in ``FakeVision``); a clip is a list of int frames. A clip's patch
    grid is ``(frames // 2, 2, 2)``: one token per temporal group after the 2 x 2 merge; the
    tower's output of a group is the mean of its frames, so frame order reaches the embedding."""

    def __init__(self) -> None:
        super().__init__()
        self.forwards: list[list[int]] = []

    def preprocess(self, image: Any) -> tuple[Any, Any, tuple[int, int, int]]:
        if not isinstance(image, list):
            return super().preprocess(image)
        frames = image[: len(image) // 2 * 2] if len(image) > 1 else image * 2
        values = [_value(f) for f in frames for _ in range(2)]  # 4 patches per group, 2 per frame
        return torch.tensor(values).unsqueeze(1), (56, 56), (len(frames) // 2, 2, 2)

    def forward(self, x: torch.Tensor, params: dict[str, Any]) -> torch.Tensor:
        assert params["grid_thw"].tolist() == [[1, 2, 2]]  # one temporal group at a time
        self.forwards.append(params["grid_thw"].tolist())
        return x.mean(dim=1, keepdim=True)


def _value(frame: Any) -> float:
    """A frame's value: the int itself, or a decoded frame's mean brightness."""
    return float(frame) if isinstance(frame, int) else float(sum(frame.convert("L").getdata())) / 1e4


class FakeMMEmbedding:
    next_index = 2_000_000_000

    def __init__(self, embeddings: torch.Tensor, token_string: torch.Tensor, **_: Any) -> None:
        self.embeddings = embeddings
        self.first_index = FakeMMEmbedding.next_index
        self.last_index = self.first_index + embeddings.shape[0]
        FakeMMEmbedding.next_index = self.last_index
        self.metadata: dict[str, Any] = {}
        assert token_string.shape == (1, embeddings.shape[0])


@pytest.fixture(autouse=True)
def no_exllamav3(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rotary frequencies are exllamav3's; the fake tower does not need them."""
    monkeypatch.setattr(vision_module, "_grid_frequencies", lambda grid, vision: None)


def engine(fake: FakeGenerator, vision: ClipVision, glm: Any = None) -> backend.Exllamav3Generator:
    return with_vision(fake, vision, glm, SimpleNamespace(**vars(FAKE_EXL), MMEmbedding=FakeMMEmbedding))


def run(generator: Any, prompt: list[int], inputs: dict[str, Any]) -> list[int]:
    params = SamplingParams(max_tokens=2, temperature=0.0, prefill_inputs=inputs)

    async def collect() -> list[int]:
        return [t async for t in generator.generate(prompt, params, threading.Event())]

    return asyncio.run(collect())


def video_message(url: str) -> list[dict[str, Any]]:
    return [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what happens?"},
                {"type": "video_url", "video_url": {"url": url}},
            ],
        }
    ]


# --- the prompt -----------------------------------------------------------------------------------


def test_runs_inside_a_video_segment_take_the_clips_groups_in_prompt_order() -> None:
    prompt = [1, IMAGE, IMAGE, 2, BEGIN_VIDEO, IMAGE, 3, IMAGE, 4, END_VIDEO, IMAGE, 5]
    spans = backend.prompt_spans(
        prompt,
        IMAGE,
        BEGIN_VIDEO,
        END_VIDEO,
        [range(10, 12), range(20, 21)],
        [[range(30, 31), range(31, 32)]],
    )
    assert spans == [range(10, 12), range(30, 31), range(31, 32), range(20, 21)]
    assert backend.splice_embeddings(prompt, IMAGE, spans) == [1, 10, 11, 2, 8, 30, 3, 31, 4, 9, 20, 5]


@pytest.mark.parametrize(
    ("pictures", "videos"),
    [
        ([range(10, 12)], [[range(30, 31)]]),  # a clip with fewer groups than its runs
        ([range(10, 12)], [[range(30, 31), range(31, 32), range(32, 33)]]),  # more groups
        ([range(10, 12), range(12, 13)], [[range(30, 31), range(31, 32)]]),  # a picture too many
        ([range(10, 12)], [[range(30, 31), range(31, 32)], [range(40, 41)]]),  # a clip too many
    ],
)
def test_clips_and_runs_that_do_not_pair_up_are_refused(
    pictures: list[range], videos: list[list[range]]
) -> None:
    prompt = [IMAGE, IMAGE, BEGIN_VIDEO, IMAGE, 3, IMAGE, END_VIDEO]
    with pytest.raises(ValueError):
        backend.prompt_spans(prompt, IMAGE, BEGIN_VIDEO, END_VIDEO, pictures, videos)


def test_a_clip_is_measured_by_the_tower_and_rendered_as_glms_video_structure() -> None:
    messages = video_message(mp4(frames=8, rate=4))  # 2 s: 4 frames at 2 frames/s, 2 groups
    media = load_media(collect_media(messages))
    processor = backend.VisionPreprocessor(ClipVision(), torch)
    prompt, tensors = vision_inputs(
        PromptRenderer().render(messages), media, image_processor=processor, video_processor=processor
    )
    assert tensors["video_grid_thw"].tolist() == [[2, 2, 2]]
    assert [len(clip) for clip in tensors["pixel_values_videos"]] == [4]  # the frames travel as frames
    video = prompt[prompt.index("<|begin_of_video|>") : prompt.index("<|end_of_video|>")]
    assert video == (
        "<|begin_of_video|><|begin_of_image|><|image|><|end_of_image|>0.0 seconds"
        "<|begin_of_image|><|image|><|end_of_image|>1.0 seconds"
    )


def test_a_clip_past_the_token_limit_is_refused_naming_it() -> None:
    media = load_media(collect_media(video_message(mp4(frames=12, rate=2))))  # 12 frames, 6 groups
    processor = backend.VisionPreprocessor(ClipVision(), torch)
    with pytest.raises(MediaError, match=r"takes 6 tokens, more than 5 per clip \(max_video_tokens\)"):
        vision_inputs(
            "<|video|>",
            media,
            image_processor=processor,
            video_processor=processor,
            limits=DecodeLimits(max_video_tokens=5),
        )


def test_a_clip_past_the_frame_limit_is_refused_naming_it() -> None:
    parts = collect_media(video_message(mp4(frames=12, rate=2)))
    with pytest.raises(MediaError, match=r"longer than 5 frames at 2 frames/s \(max_video_frames"):
        load_media(parts, DecodeLimits(max_video_frames=5))


# --- the engine thread ----------------------------------------------------------------------------


def test_one_embedding_per_clip_is_spliced_group_by_group() -> None:
    fake, vision = FakeGenerator(), ClipVision()
    generator = engine(fake, vision)
    try:
        prompt = [1, IMAGE, BEGIN_VIDEO, IMAGE, 3, IMAGE, END_VIDEO, 2]
        run(generator, prompt, {"pixel_values": [1], "pixel_values_videos": [[10, 20, 30, 40]]})
        run(generator, prompt, {"pixel_values": [1], "pixel_values_videos": [[40, 30, 20, 10]]})
    finally:
        generator.close()
    forward, backward = fake.seen
    picture, clip = forward.kwargs["embeddings"]
    first = clip.first_index
    assert forward.prompt == [1, picture.first_index, BEGIN_VIDEO, first, 3, first + 1, END_VIDEO, 2]
    assert clip.embeddings.flatten().tolist() == [15.0, 35.0]  # group means, in frame order
    assert backward.kwargs["embeddings"][1].embeddings.flatten().tolist() == [35.0, 15.0]
    assert vision.forwards == [[[1, 2, 2]]] * 4  # the tower ran once per temporal group


def test_a_clip_that_does_not_fit_its_placeholders_fails_that_request_only() -> None:
    fake = FakeGenerator()
    generator = engine(fake, ClipVision())
    try:
        with pytest.raises(Exception, match="could not be read"):
            run(generator, [1, BEGIN_VIDEO, IMAGE, END_VIDEO], {"pixel_values_videos": [[1, 2, 3, 4]]})
        assert run(generator, [1, 5], {}) == [6, 7]
    finally:
        generator.close()


# --- through an engine core -----------------------------------------------------------------------


@pytest.fixture
def core() -> Iterator[tuple[CoreClient, FakeGenerator]]:
    fake, vision = FakeGenerator(), ClipVision()
    generator = engine(
        fake, vision, SimpleNamespace(image_processor=backend.VisionPreprocessor(vision, torch))
    )
    ours, theirs = (Connection(s.detach()) for s in socket.socketpair())
    client = CoreClient(ours, CoreThread(theirs, generator), core_main._ready_info(generator))  # type: ignore[arg-type]
    client._reader.start()
    try:
        yield client, fake
    finally:
        client.close()


def test_a_clip_crosses_the_cores_wire_to_be_measured_and_embedded(
    core: tuple[CoreClient, FakeGenerator],
) -> None:
    client, fake = core
    processor = client.picture_processor()
    assert processor is not None and processor.temporal_patch_size == 2  # from the core's ready
    measured = processor(videos=[[10, 20, 30, 40, 50]], return_tensors="pt")  # as vision_inputs asks
    assert measured["video_grid_thw"].tolist() == [[2, 2, 2]]  # the core's tower trimmed 5 frames to 4
    prompt = [1, BEGIN_VIDEO, IMAGE, 3, IMAGE, END_VIDEO]
    assert run(client, prompt, {"pixel_values_videos": measured["pixel_values_videos"]}) == [
        END_VIDEO + 1,
        END_VIDEO + 2,
    ]  # the fake replies from the last token
    (clip,) = fake.seen[0].kwargs["embeddings"]
    assert fake.seen[0].prompt == [1, BEGIN_VIDEO, clip.first_index, 3, clip.first_index + 1, END_VIDEO]
    assert clip.embeddings.flatten().tolist() == [15.0, 35.0]
