"""Pictures and video clips for exllamav3: measuring them for the prompt, splicing their embeddings in.

A picture is one ``MMEmbedding`` from exllamav3's ``get_image_embeddings``. A clip is one
``MMEmbedding`` too (:func:`embed_video`): exllamav3's ``Glm5NextVisionModel.preprocess``, given a
*list* of frames, sizes one canvas for all of them within the video token budget and returns one
patch tensor with grid ``(frames / temporal_patch_size, h, w)``; the tower then runs once per
temporal group (grid ``(1, h, w)``), as transformers' ``Glm5NextModel.get_video_features`` runs it,
so each group attends within itself. In the prompt a clip is GLM's video structure
(``sparkfold.glm.media``: ``<|begin_of_video|>``, then per group ``<|begin_of_image|>``, that
group's run of ``<|image|>`` placeholders, ``<|end_of_image|>`` and its time, then
``<|end_of_video|>``); :func:`prompt_spans` gives each run its embedding ids.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Any

__all__ = [
    "RemoteVisionPreprocessor",
    "VisionPreprocessor",
    "embed_video",
    "prompt_spans",
    "splice_embeddings",
]


def splice_embeddings(prompt: Sequence[int], image_token: int, spans: Sequence[range]) -> list[int]:
    """``prompt`` with the n-th run of ``image_token`` replaced by the n-th picture's embedding ids.

    exllamav3 marks where an ``MMEmbedding`` goes by ids past the vocabulary (its
    ``first_index`` … ``last_index``); each run of placeholders must be as long as its picture.
    """
    out: list[int] = []
    runs = iter(spans)
    i = 0
    while i < len(prompt):
        if prompt[i] != image_token:
            out.append(prompt[i])
            i += 1
            continue
        end = i
        while end < len(prompt) and prompt[end] == image_token:
            end += 1
        span = next(runs, None)
        if span is None or len(span) != end - i:
            size = len(span) if span is not None else 0
            raise ValueError(f"a picture takes {end - i} placeholder tokens, its embedding {size}")
        out.extend(span)
        i = end
    if next(runs, None) is not None:
        raise ValueError("more pictures than placeholder runs in the prompt")
    return out


def prompt_spans(
    prompt: Sequence[int],
    image_token: int,
    begin_video: int,
    end_video: int,
    pictures: Sequence[range],
    videos: Sequence[Sequence[range]],
) -> list[range]:
    """The embedding ids of each run of ``image_token`` in ``prompt``, in prompt order.

    A run between ``begin_video`` and ``end_video`` takes the next temporal group of the clip
    that segment opened (``videos``: each clip's groups); any other run takes the next picture.
    Raises ``ValueError`` when runs and inputs do not pair up.
    """
    spans: list[range] = []
    picture_spans = iter(pictures)
    clips = iter(videos)
    groups: Any = None  # the open clip's groups, None outside a video segment
    previous = None
    for token in prompt:
        if token == begin_video:
            groups = iter(next(clips, ()))
        elif token == end_video:
            if groups is not None and next(groups, None) is not None:
                raise ValueError("a video has more frame groups than its segment has placeholder runs")
            groups = None
        elif token == image_token and previous != image_token:
            span = next(picture_spans if groups is None else groups, None)
            if span is None:
                raise ValueError("more placeholder runs in the prompt than pictures and video frames")
            spans.append(span)
        previous = token
    if next(picture_spans, None) is not None or next(clips, None) is not None:
        raise ValueError("more pictures or videos than placeholders in the prompt")
    return spans


def _grid_frequencies(grid: tuple[int, int, int], vision: Any) -> Any:
    """The tower's 2-D rotary frequencies of a patch grid (exllamav3's own, as for pictures)."""
    qwen2 = importlib.import_module("exllamav3.architecture.mm_processing.qwen2")
    return qwen2.qwen2_position_embedding_grid_2d(
        grid, vision.head_dim, vision.spatial_merge_size, vision.rope_theta
    )


def embed_video(
    vision_model: Any, torch: Any, mm_embedding: Any, frames: Sequence[Any]
) -> tuple[Any, list[range]]:
    """One clip's ``MMEmbedding`` (exllamav3's ``MMEmbedding`` class: ``mm_embedding``) and the id
    range of each temporal group, in order: one run of placeholders each in the prompt."""
    patches, size, grid = vision_model.preprocess(list(frames))
    t, h, w = (int(n) for n in grid)
    v = vision_model.config.vision
    frequencies = _grid_frequencies((1, h, w), v)
    rows = h * w
    groups = []
    for g in range(t):  # fresh params each pass: the tower may keep per-call state in them
        params = {
            "causal": False,
            "grid_thw": torch.tensor([[1, h, w]], dtype=torch.int),
            "inv_freq": frequencies,
        }
        out = vision_model.forward(patches[g * rows : (g + 1) * rows].unsqueeze(0), params=params)
        groups.append(out.cpu()[0])
    embeddings = torch.cat(groups, dim=0)
    count = int(embeddings.shape[0])
    embedding = mm_embedding(
        embeddings=embeddings,
        token_string=torch.full((1, count), -1, dtype=torch.long),
        grid_thw=(t, h, w),
        mrope_merge_size=v.spatial_merge_size,
    )
    embedding.metadata.update({"frames": len(frames), "preprocessed_size": size})
    per_group = count // t
    first = int(embedding.first_index)
    return embedding, [range(first + g * per_group, first + (g + 1) * per_group) for g in range(t)]


class VisionPreprocessor:
    """exllamav3's own picture and clip preparation, in the shape ``sparkfold.glm.media.vision_inputs``
    calls (as its image and its video processor).

    It only measures each picture or clip (its patch grid, hence its token count, so the prompt
    gets the right number of placeholders; a clip is a list of frames, which exllamav3's
    ``preprocess`` takes as a video); the pictures and frames themselves travel in
    ``prefill_inputs`` and the engine thread runs the vision tower on them
    (``Exllamav3Generator._embed_pictures``).
    """

    def __init__(self, vision_model: Any, torch: Any) -> None:
        self._vision = vision_model
        self._torch = torch
        self.merge_size = int(vision_model.config.vision.spatial_merge_size)
        self.temporal_patch_size = int(vision_model.config.vision.temporal_patch_size)

    def grids(self, inputs: Sequence[Any]) -> list[list[int]]:
        """Each picture's (or clip's: a list of frames) patch grid ``[t, h, w]`` (what an engine core
        answers a ``measure`` with)."""
        return [[int(n) for n in self._vision.preprocess(item)[2]] for item in inputs]

    def __call__(
        self, images: Sequence[Any] | None = None, videos: Sequence[Sequence[Any]] | None = None, **_: Any
    ) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if images is not None:
            out |= {"pixel_values": list(images), "image_grid_thw": self._torch.tensor(self.grids(images))}
        if videos is not None:
            clips = [list(frames) for frames in videos]
            out |= {"pixel_values_videos": clips, "video_grid_thw": self._torch.tensor(self.grids(clips))}
        return out


class RemoteVisionPreprocessor(VisionPreprocessor):
    """A :class:`VisionPreprocessor` on the HTTP side of an engine core: its grids come from the core.

    ``grids`` is :meth:`~sparkfold.engines.core.client.CoreClient.measure_pictures` (a round trip
    to the core, whose vision tower is on the GPU); ``merge_size`` and ``temporal_patch_size`` come
    with the core's ``ready``.
    """

    def __init__(
        self,
        grids: Callable[[Sequence[Any]], list[list[int]]],
        merge_size: int,
        torch: Any,
        temporal_patch_size: int = 2,
    ) -> None:
        self._remote = grids
        self._torch = torch
        self.merge_size = merge_size
        self.temporal_patch_size = temporal_patch_size

    def grids(self, images: Sequence[Any]) -> list[list[int]]:
        return self._remote(images)
