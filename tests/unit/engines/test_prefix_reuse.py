"""Prefix reuse in the transformers engine: a request that starts like an earlier one reads only the
rest of its prompt, and gets exactly the reply (token ids and log-probabilities, bit for bit) that
it gets from a cold cache. Run on the tiny GLM-5.3-Flash (random weights: near-flat logits, so
a wrong cache shows in every log-probability), whose layers are both kinds a lane must put back:
linear attention (a recurrent state, restored from a copy) and sparse attention (keys, cropped).
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from sparkfold.engines.generator import SamplingParams, TokenLogprob
from sparkfold.engines.transformers.backend import ModelRunner, TransformersGenerator
from sparkfold.engines.transformers.lanes import SlotCache, common_prefix
from sparkfold.testing import torch_threads

transformers = pytest.importorskip("transformers")

BLOCK = 16
SHARED = 100
"""Prompt tokens the requests share (a system prompt and tools): reuse resumes at 96, six chunks."""


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from sparkfold.testing.tiny_glm import write_tiny_glm

    path = write_tiny_glm(tmp_path_factory.mktemp("tiny-glm"))
    return transformers.AutoModelForImageTextToText.from_pretrained(str(path)).eval()


@pytest.fixture(scope="module")
def tokenizer(model: Any) -> Any:
    return transformers.AutoTokenizer.from_pretrained(model.name_or_path)


def _engine(model: Any, tokenizer: Any, keep_tokens: int, parallel: int = 1) -> TransformersGenerator:
    runner = ModelRunner(model, block=BLOCK, keep_tokens=keep_tokens)
    return TransformersGenerator(
        runner, tokenizer, context_length=512, parallel=parallel, prefill_chunk_tokens=BLOCK
    )


@pytest.fixture
def cold(model: Any, tokenizer: Any) -> Iterator[TransformersGenerator]:
    engine = _engine(model, tokenizer, keep_tokens=0)
    with torch_threads(1):
        yield engine
    engine.close()


@pytest.fixture
def warm(model: Any, tokenizer: Any) -> Iterator[TransformersGenerator]:
    engine = _engine(model, tokenizer, keep_tokens=4096, parallel=2)
    with torch_threads(1):
        yield engine
    engine.close()


Reply = tuple[list[int], list[TokenLogprob], int]
"""Token ids, their log-probabilities, the prompt tokens the engine reused."""


async def _reply(engine: TransformersGenerator, prompt: list[int]) -> Reply:
    params = SamplingParams(max_tokens=8, ignore_eos=True, logprobs=2)
    ids = [t async for t in engine.generate(prompt, params, threading.Event())]
    return ids, params.logprobs_out, params.report.cached_tokens


def _run(engine: TransformersGenerator, prompt: list[int]) -> Reply:
    return asyncio.run(asyncio.wait_for(_reply(engine, prompt), timeout=120))


def _tokens(seed: int, count: int) -> list[int]:
    from sparkfold.testing.tiny_glm import SPECIAL_BASE

    rng = random.Random(seed)
    return [rng.randrange(SPECIAL_BASE) for _ in range(count)]


def test_a_reused_prefix_gives_the_cold_reply_bit_for_bit(
    warm: TransformersGenerator, cold: TransformersGenerator
) -> None:
    shared = _tokens(0, SHARED)
    first, second = shared + _tokens(1, 21), shared + _tokens(2, 13)
    assert _run(warm, first)[2] == 0
    ids, logprobs, reused = _run(warm, second)
    assert reused == 96  # six whole chunks of the shared 100 tokens
    assert (ids, logprobs) == _run(cold, second)[:2]
    # the next turn: the previous prompt, its reply and more; resumes at that prompt's last whole chunk
    turn = second + ids + _tokens(3, 9)
    ids, logprobs, reused = _run(warm, turn)
    assert reused == 112
    assert (ids, logprobs) == _run(cold, turn)[:2]


def test_concurrent_requests_each_take_the_lane_that_holds_their_prefix(
    warm: TransformersGenerator, cold: TransformersGenerator
) -> None:
    a, b = _tokens(4, 70), _tokens(5, 40)
    _run(warm, a + _tokens(6, 5))

    async def both() -> list[Reply]:
        return list(await asyncio.gather(_reply(warm, b), _reply(warm, a + _tokens(7, 3))))

    other, again = asyncio.run(asyncio.wait_for(both(), timeout=120))
    assert (other[2], again[2]) == (0, 64)
    assert other[:2] == _run(cold, b)[:2]
    assert again[:2] == _run(cold, a + _tokens(7, 3))[:2]


def test_a_cold_engine_reuses_nothing(cold: TransformersGenerator) -> None:
    prompt = _tokens(8, 40)
    _run(cold, prompt)
    assert _run(cold, prompt)[2] == 0


def test_a_lane_keeps_at_most_its_bound(model: Any) -> None:
    runner = ModelRunner(model, block=BLOCK, keep_tokens=40)
    prompt = _tokens(9, 70)
    with torch_threads(1):
        runner.open(0)
        for start in range(0, 64, BLOCK):
            runner.forward(0, prompt[start : start + BLOCK])
        runner.close(0)
    assert runner.reusable(0, prompt) == 32  # no mark is set past 40 tokens


def test_a_lane_resumes_only_at_its_marks_and_never_after_pictures() -> None:
    lane = SlotCache(_Empty, block=4, keep_tokens=64)
    lane.fed([1, 2, 3, 4])
    lane.fed([5, 6, 7])  # a partial chunk: no mark at 7
    assert lane.reusable([1, 2, 3, 4, 5, 6, 7, 8]) == 4
    assert lane.reusable([1, 2, 3, 4]) == 0  # one token must be left to read
    with pytest.raises(ValueError, match="no mark at 7"):
        lane.keep(7)
    lane.keep(4)
    lane.unmarked()  # what went in was more than its ids (pictures)
    assert lane.reusable([1, 2, 3, 4, 5, 6, 7, 8]) == 0
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2


class _Empty:
    """A cache without layers (the lane's bookkeeping alone)."""

    def __init__(self) -> None:
        self.layers: list[Any] = []
