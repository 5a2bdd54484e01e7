"""Pictures through an engine core on exllamav3, without a GPU: the fake exllamav3 and its fake vision tower.

The core's side (:func:`sparkfold.engines.core.main.serve`) runs in a thread on one end of a socket
pair and the server's :class:`~sparkfold.engines.core.client.CoreClient` on the other, so every
message crosses the real wire (pickled, framed) as it does between the two processes.
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
from tests.unit.engines.test_exllamav3 import FakeGenerator, FakeVision, with_vision

from sparkfold.engines import exllamav3 as backend
from sparkfold.engines.core import main as core_main
from sparkfold.engines.core.client import CoreClient
from sparkfold.engines.generator import EngineGone, SamplingParams
from sparkfold.glm.errors import MediaError


class PickyVision(FakeVision):
    """The fake vision tower; a negative picture is one it cannot read."""

    def preprocess(self, image: int) -> tuple[None, None, tuple[int, int, int]]:
        if image < 0:
            raise ValueError("not a picture")
        return super().preprocess(image)


class CoreThread:
    """Stands in for the core's process: ``serve`` in a thread (``wait`` joins it)."""

    def __init__(self, conn: Connection, generator: Any) -> None:
        self.pid = 0
        self._thread = threading.Thread(target=self._run, args=(conn, generator), daemon=True)
        self._thread.start()

    @staticmethod
    def _run(conn: Connection, generator: Any) -> None:
        try:
            core_main.serve(conn, generator)
        finally:
            conn.close()

    def wait(self, timeout: float | None = None) -> int:
        self._thread.join(timeout)
        return 0

    def kill(self) -> None:
        pass


@pytest.fixture
def core() -> Iterator[tuple[CoreClient, FakeGenerator, Connection]]:
    fake = FakeGenerator()
    vision = PickyVision()
    generator = with_vision(
        fake, vision, SimpleNamespace(image_processor=backend.VisionPreprocessor(vision, torch))
    )
    ours, theirs = (Connection(s.detach()) for s in socket.socketpair())
    info = core_main._ready_info(generator)
    client = CoreClient(ours, CoreThread(theirs, generator), info)  # type: ignore[arg-type]
    client._reader.start()
    try:
        yield client, fake, theirs
    finally:
        client.close()


async def collect(client: CoreClient, prompt: list[int], params: SamplingParams) -> list[int]:
    return [t async for t in client.generate(prompt, params, threading.Event())]


def test_the_cores_vision_tower_measures_and_embeds_the_pictures(
    core: tuple[CoreClient, FakeGenerator, Connection],
) -> None:
    client, fake, _ = core
    processor = client.picture_processor()
    assert processor is not None and processor.merge_size == 2  # from the core's ready
    measured = processor(images=[3], return_tensors="pt")  # as sparkfold.glm.media.vision_inputs asks
    assert measured["image_grid_thw"].tolist() == [[1, 2, 6]] and measured["pixel_values"] == [3]
    params = SamplingParams(max_tokens=2, temperature=0.0, prefill_inputs={"pixel_values": [3]})
    assert asyncio.run(collect(client, [1, 7, 7, 7, 2], params)) == [3, 4]
    job = fake.seen[0]  # the core's engine thread ran the vision tower and spliced its embedding in
    assert job.prompt == [1, 1_000_000_000, 1_000_000_001, 1_000_000_002, 2]
    assert [e.first_index for e in job.kwargs["embeddings"]] == [1_000_000_000]


def test_a_picture_the_core_cannot_read_is_a_400_and_the_core_serves_on(
    core: tuple[CoreClient, FakeGenerator, Connection],
) -> None:
    client, _, _ = core
    with pytest.raises(MediaError, match="could not be read: not a picture"):
        client.measure_pictures([2, -1])
    assert client.measure_pictures([1]) == [[1, 2, 2]]


def test_pictures_for_a_gone_core_are_engine_gone(core: tuple[CoreClient, FakeGenerator, Connection]) -> None:
    client, _, theirs = core
    with socket.fromfd(theirs.fileno(), socket.AF_UNIX, socket.SOCK_STREAM) as end:
        end.shutdown(socket.SHUT_RDWR)  # the core's end of the pipe goes, as when its process dies
    client._reader.join(timeout=30)
    with pytest.raises(EngineGone, match="engine core"):
        client.measure_pictures([1])


def test_an_engine_without_a_vision_tower_offers_no_picture_processor() -> None:
    info = {
        "backend": "exllamav3",
        "context_length": 16,
        "parallel": 1,
        "eos_token_ids": frozenset(),
        "vocab_size": 8,
        "tp": 1,
        "supports_logprobs": False,
        "status": {},
        "pictures_merge_size": None,
    }
    client = CoreClient(None, None, info)  # type: ignore[arg-type]
    assert client.picture_processor() is None
