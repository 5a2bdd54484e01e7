"""The transformers engine's scheduler and generation on a tiny random Llama (no files, no network)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator, Sequence

import pytest
import torch

from sparkfold.engines.generator import CapacityError, EngineFailure, SamplingParams
from sparkfold.engines.transformers.backend import ModelRunner, TransformersGenerator

transformers = pytest.importorskip("transformers")


class ByteTokenizer:
    chat_template = None
    eos_token = None
    eos_token_id = None

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [b % 64 for b in text.encode()]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return "".join(chr(65 + i % 26) for i in ids)

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str]:
        return [self.decode([i]) for i in ids]


@pytest.fixture(scope="module")
def model() -> object:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    model = transformers.LlamaForCausalLM(config).eval()
    model.generation_config.eos_token_id = None
    return model


@pytest.fixture
def generator(model: object) -> Iterator[TransformersGenerator]:
    engine = TransformersGenerator(ModelRunner(model), ByteTokenizer(), context_length=128, parallel=2)
    yield engine
    engine.close()


async def _collect(
    engine: TransformersGenerator,
    prompt: list[int],
    params: SamplingParams,
    cancel: threading.Event | None = None,
) -> list[int]:
    return [t async for t in engine.generate(prompt, params, cancel or threading.Event())]


def test_greedy_equals_generate(generator: TransformersGenerator, model: object) -> None:
    prompt = [5, 9, 13, 2, 40]
    ours = asyncio.run(_collect(generator, prompt, SamplingParams(max_tokens=12)))
    with torch.inference_mode():
        ref = model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, pad_token_id=0)  # type: ignore[attr-defined]
    assert ours == ref[0, len(prompt) :].tolist()


def test_interleaved_requests_get_what_they_get_alone(generator: TransformersGenerator) -> None:
    prompts = [[1, 2, 3], [7, 7, 7, 7, 7, 7]]
    params = SamplingParams(max_tokens=10)
    alone = [asyncio.run(_collect(generator, p, params)) for p in prompts]

    async def together() -> list[list[int]]:
        return list(await asyncio.gather(*(_collect(generator, p, params) for p in prompts)))

    assert asyncio.run(together()) == alone


def test_seeded_sampling_repeats_and_differs_by_seed(generator: TransformersGenerator) -> None:
    def draw(seed: int) -> list[int]:
        return asyncio.run(
            _collect(generator, [3, 4], SamplingParams(max_tokens=16, temperature=1.5, seed=seed))
        )

    assert draw(1) == draw(1)
    assert draw(1) != draw(2)


def test_a_cancelled_request_stops_and_frees_its_slot(generator: TransformersGenerator) -> None:
    async def cancel_after_two() -> list[int]:
        cancel = threading.Event()
        got = []
        async for token in generator.generate([1, 2], SamplingParams(max_tokens=100), cancel):
            got.append(token)
            if len(got) == 2:
                cancel.set()
        return got

    assert 2 <= len(asyncio.run(cancel_after_two())) < 100
    for _ in range(3):  # slots were returned: more requests than `parallel` still run, one by one
        assert len(asyncio.run(_collect(generator, [1], SamplingParams(max_tokens=3)))) == 3


def test_more_requests_than_parallel_get_capacity_error(model: object) -> None:
    engine = TransformersGenerator(ModelRunner(model), ByteTokenizer(), context_length=128, parallel=1)

    async def two() -> list[object]:
        params = SamplingParams(max_tokens=30)
        return list(
            await asyncio.gather(
                *(_collect(engine, [1, 2], params) for _ in range(2)), return_exceptions=True
            )
        )

    try:
        results = asyncio.run(two())
    finally:
        engine.close()
    assert sum(isinstance(r, CapacityError) for r in results) == 1
    assert sum(isinstance(r, list) and len(r) == 30 for r in results) == 1


def test_a_request_the_torch_generator_refuses_fails_alone(generator: TransformersGenerator) -> None:
    # a seed past 64 bits (the protocol bounds it; a caller of the generator may not) once ended
    # the engine thread, and the engine with it
    params = SamplingParams(max_tokens=4, temperature=1.0, seed=2**64)
    with pytest.raises(EngineFailure, match="sampling parameters"):
        asyncio.run(asyncio.wait_for(_collect(generator, [1, 2], params), timeout=20))
    assert generator.healthy()
    assert len(asyncio.run(_collect(generator, [1, 2], SamplingParams(max_tokens=3)))) == 3


def test_a_slot_that_failed_to_open_is_free_again(model: object) -> None:
    # a failed open once kept its slot: after `parallel` such failures every request got
    # "pop from empty list" (seen on the testbed after a rank restart)
    runner = ModelRunner(model)
    opened = runner.open
    failures = iter([True, True, True])

    def open_or_fail(slot: int, keep: int = 0) -> None:
        if next(failures, False):
            raise RuntimeError("the link to the other rank is gone")
        opened(slot, keep)

    runner.open = open_or_fail  # type: ignore[method-assign]
    engine = TransformersGenerator(runner, ByteTokenizer(), context_length=128, parallel=2)
    try:
        for _ in range(3):
            with pytest.raises(EngineFailure, match="could not be started"):
                asyncio.run(
                    asyncio.wait_for(_collect(engine, [1, 2], SamplingParams(max_tokens=2)), timeout=20)
                )
        assert (
            len(
                asyncio.run(
                    asyncio.wait_for(_collect(engine, [1, 2], SamplingParams(max_tokens=3)), timeout=20)
                )
            )
            == 3
        )
    finally:
        engine.close()


def test_a_thinking_budget_closes_the_reasoning_after_n_tokens(generator: TransformersGenerator) -> None:
    from sparkfold.glm.budget import ThinkingBudget

    baseline = asyncio.run(_collect(generator, [1, 2, 3], SamplingParams(max_tokens=6)))
    think_end = next(t for t in range(64) if t not in baseline)  # a token the model would not pick
    budget = ThinkingBudget(3, think_end, 64)
    budgeted = asyncio.run(_collect(generator, [1, 2, 3], SamplingParams(max_tokens=6, constraint=budget)))
    assert budgeted[:3] == baseline[:3]  # three reasoning tokens as the model chose them ...
    assert budgeted[3] == think_end  # ... then </think>, forced
    assert budget.spent == 3


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_grammar_dead_end_ends_the_reply_with_its_error(
    generator: TransformersGenerator, temperature: float
) -> None:
    # main sampled from the all -inf row: "probability tensor contains inf" (sampled), token 0 (greedy)
    from tests.fakes.small_vocab import small_matcher

    from sparkfold.glm.errors import GrammarDeadEnd

    tokens: list[int] = []

    async def run(params: SamplingParams) -> None:
        async for token in generator.generate([1, 2], params, threading.Event()):
            tokens.append(token)

    params = SamplingParams(
        max_tokens=8, temperature=temperature, seed=1, constraint=small_matcher('root ::= "A" "!"')
    )
    with pytest.raises(GrammarDeadEnd, match="allows no token after 1 tokens"):
        asyncio.run(asyncio.wait_for(run(params), timeout=20))
    assert tokens == [0]  # "A", then nothing sampled
    assert generator.healthy()


def test_at_temperature_0_a_constrained_reply_matches_its_grammar(generator: TransformersGenerator) -> None:
    import re

    from tests.fakes.small_vocab import STOP, VOCAB, small_matcher

    for ebnf, pattern in [
        ('root ::= "AB" [0-9]{1,3} " " ("yes" | "no")', r"AB[0-9]{1,3} (yes|no)"),
        ('root ::= "(" a ")" | "x"\na ::= "(" "x" ")" | "x"', r"\(\(x\)\)|\(x\)|x"),
        ("root ::= [a-c]{2,4}", r"[a-c]{2,4}"),
    ]:
        params = SamplingParams(
            max_tokens=40, stop_token_ids=frozenset({STOP}), constraint=small_matcher(ebnf)
        )
        ids = asyncio.run(asyncio.wait_for(_collect(generator, [3, 4, 5], params), timeout=20))
        assert ids and ids[-1] == STOP, (ebnf, ids)
        assert re.fullmatch(pattern, "".join(VOCAB[i] for i in ids[:-1])), (ebnf, ids)


class _Recording(ModelRunner):
    """A runner that records each forward's slot and length (the engine thread's order)."""

    def __init__(self, model: object) -> None:
        super().__init__(model)
        self.calls: list[tuple[int, int]] = []

    def forward(self, slot: int, ids: Sequence[int], extra: object = None) -> torch.Tensor:
        self.calls.append((slot, len(ids)))
        return super().forward(slot, ids, extra)  # type: ignore[arg-type]


def test_a_long_prompt_is_read_in_chunks_between_the_other_streams_tokens(model: object) -> None:
    """While a long prompt is read, a decoding stream waits at most one chunk between its tokens,
    and the chunked reply equals the one read whole."""
    runner = _Recording(model)
    engine = TransformersGenerator(
        runner, ByteTokenizer(), context_length=128, parallel=2, prefill_chunk_tokens=16
    )
    long_prompt = [(7 * i) % 64 for i in range(100)]
    try:

        async def both() -> tuple[list[int], list[int]]:
            streaming = asyncio.create_task(_collect(engine, [5, 9], SamplingParams(max_tokens=20)))
            while not runner.calls:
                await asyncio.sleep(0.001)
            long = await _collect(engine, long_prompt, SamplingParams(max_tokens=3))
            return await streaming, long

        _, chunked = asyncio.run(both())
    finally:
        engine.close()
    long_slot = next(slot for slot, n in runner.calls if n == 16)
    reads = [n for slot, n in runner.calls if slot == long_slot][:7]
    assert reads == [16, 16, 16, 16, 16, 16, 4]  # 100 prompt tokens, 16 a step
    between = [n for slot, n in runner.calls if slot != long_slot]
    assert max(between[1:]) == 1  # the other stream decoded a token per step all along
    first, last = runner.calls.index((long_slot, 16)), runner.calls.index((long_slot, 4))
    assert any(slot != long_slot for slot, _ in runner.calls[first:last])  # interleaved, not one block
    whole = TransformersGenerator(ModelRunner(model), ByteTokenizer(), context_length=128, parallel=1)
    try:
        assert asyncio.run(_collect(whole, long_prompt, SamplingParams(max_tokens=3))) == chunked
    finally:
        whole.close()
