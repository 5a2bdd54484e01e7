"""Pictures for exllamav3: measuring them for the prompt, splicing their embeddings into it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["RemoteVisionPreprocessor", "VisionPreprocessor", "splice_embeddings"]


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


class VisionPreprocessor:
    """exllamav3's own picture preparation, in the shape ``sparkfold.glm.media.vision_inputs`` calls.

    It only measures each picture (its patch grid, hence its token count, so the prompt gets the
    right number of placeholders); the pictures themselves travel in ``prefill_inputs`` and the
    engine thread runs the vision tower on them (``Exllamav3Generator._embed_pictures``).
    """

    def __init__(self, vision_model: Any, torch: Any) -> None:
        self._vision = vision_model
        self._torch = torch
        self.merge_size = int(vision_model.config.vision.spatial_merge_size)

    def grids(self, images: Sequence[Any]) -> list[list[int]]:
        """Each picture's patch grid ``[t, h, w]`` (what an engine core answers a ``measure`` with)."""
        return [[int(n) for n in self._vision.preprocess(image)[2]] for image in images]

    def __call__(self, images: Sequence[Any], **_: Any) -> dict[str, Any]:
        return {"pixel_values": list(images), "image_grid_thw": self._torch.tensor(self.grids(images))}


class RemoteVisionPreprocessor(VisionPreprocessor):
    """A :class:`VisionPreprocessor` on the HTTP side of an engine core: its grids come from the core.

    ``grids`` is :meth:`~sparkfold.engines.core_process.CoreClient.measure_pictures` (a round trip
    to the core, whose vision tower is on the GPU); ``merge_size`` comes with the core's ``ready``.
    """

    def __init__(
        self, grids: Callable[[Sequence[Any]], list[list[int]]], merge_size: int, torch: Any
    ) -> None:
        self._remote = grids
        self._torch = torch
        self.merge_size = merge_size

    def grids(self, images: Sequence[Any]) -> list[list[int]]:
        return self._remote(images)
