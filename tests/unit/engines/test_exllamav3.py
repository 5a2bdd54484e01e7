"""The exllamav3 engine's logic without a GPU: sizing, request mapping, the engine thread (fake exllamav3)."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from sparkfold.config import EngineSettings, Exllamav3Settings
from sparkfold.engines import exllamav3 as backend
from sparkfold.engines.generator import CapacityError, EngineFailure, SamplingParams
from sparkfold.glm.grammar import allocate_bitmask

GIB = 1024**3


# --- sizing -------------------------------------------------------------------------------------


def plan(**overrides: int) -> int:
    """``plan_pool`` for one GiB free and nothing else in the way, with the named arguments changed."""
    arguments = {
        "free_bytes": GIB,
        "weight_bytes": 0,
        "reserve_bytes": 0,
        "bytes_per_token": 4096,
        "window": 10,
        "parallel": 1,
    }
    return backend.plan_pool(**(arguments | overrides))


def test_the_pool_is_free_memory_minus_weights_and_reserve_in_pages() -> None:
    tokens = plan(
        free_bytes=10 * GIB,
        weight_bytes=4 * GIB,
        reserve_bytes=2 * GIB,
        bytes_per_token=1024,
        window=10**9,
        parallel=4,
    )
    assert tokens == 4 * GIB // 1024 and tokens % 256 == 0


def test_the_pool_never_exceeds_parallel_windows() -> None:
    tokens = plan(free_bytes=100 * GIB, bytes_per_token=1, window=1000, parallel=3)
    assert tokens == 3072  # 3000 rounded up to whole pages


def test_no_room_is_a_clear_error_not_an_oom() -> None:
    with pytest.raises(backend.PoolTooSmall, match="no room for a KV pool"):
        plan(free_bytes=5 * GIB, weight_bytes=4 * GIB, reserve_bytes=2 * GIB, bytes_per_token=10)


def test_a_configured_pool_that_does_not_fit_is_refused() -> None:
    with pytest.raises(backend.PoolTooSmall, match="pool_tokens = 1048576"):
        plan(configured=1_048_576)
    assert plan(configured=2048) == 2048


def test_the_window_fits_the_pool_with_draft_headroom() -> None:
    assert backend.request_window(1_048_576, 65_536, 4, None) == 65_531
    assert backend.request_window(8192, 65_536, 4, 4096) == 4096


def test_settings_validate_pages_and_one_draft_source() -> None:
    with pytest.raises(ValueError, match="multiple of 256"):
        Exllamav3Settings(pool_tokens=1000)
    with pytest.raises(ValueError, match="one draft source"):
        Exllamav3Settings(mtp=True, ngram=3)
    with pytest.raises(ValueError, match="cpu_cache_gib"):
        Exllamav3Settings(disk_cache_dir="/var/cache/x")
    with pytest.raises(ValueError, match="shared_chunk_tokens must be a multiple of 256"):
        Exllamav3Settings(shared_chunk_tokens=1000)
    with pytest.raises(ValueError, match="must not exceed chunk_tokens"):
        Exllamav3Settings(chunk_tokens=1024, shared_chunk_tokens=2048)
    assert Exllamav3Settings(ngram=3).drafts and not Exllamav3Settings().drafts


def test_cache_choice_maps_to_exllamav3_layers() -> None:
    exl = SimpleNamespace(CacheLayer_fp16="fp16", CacheLayer_quant="quant")
    assert backend.cache_layer(exl, "fp16") == ("fp16", {})
    assert backend.cache_layer(exl, "q6") == ("quant", {"k_bits": 6, "v_bits": 6})


def test_without_cuda_the_engine_says_so() -> None:
    if torch.cuda.is_available():
        pytest.skip("this host has CUDA")
    with pytest.raises(backend.Exllamav3Unavailable, match="needs an NVIDIA GPU"):
        backend.import_exllamav3()


class WarmingModel:
    """Records ``Model.warmup``'s arguments; returns the labels of passes that raised."""

    def __init__(self, failed: list[str] | None = None) -> None:
        self.calls: list[dict[str, Any]] = []
        self.failed = failed or []

    def warmup(self, **kwargs: Any) -> list[str]:
        self.calls.append(kwargs)
        return self.failed


def test_the_engine_warms_exllamav3_up_with_its_own_shapes() -> None:
    model, cache = WarmingModel(), object()
    settings = EngineSettings(model="/m", kind="exllamav3", parallel=4, exllamav3={"chunk_tokens": 4096})
    warmed = backend.warm_up(model, cache, settings, draft_size=4)
    assert model.calls == [{"cache": cache, "max_chunk_size": 4096, "max_batch_size": 4, "max_q_len": 5}]
    assert warmed["warmup_failed"] == [] and warmed["warmup_s"] >= 0


def test_a_warm_up_pass_that_raised_is_a_warning_not_a_failed_start(caplog: pytest.LogCaptureFixture) -> None:
    model = WarmingModel(failed=["long context 2048, 2048 token(s) at 0"])
    settings = EngineSettings(model="/m", kind="exllamav3")
    with caplog.at_level("WARNING"):
        warmed = backend.warm_up(model, object(), settings, draft_size=0)
    assert warmed["warmup_failed"] == ["long context 2048, 2048 token(s) at 0"]
    assert model.calls[0]["max_q_len"] == 1
    assert "1 pass(es) raised (long context 2048" in caplog.text


def test_warmup_false_leaves_first_use_costs_to_the_first_requests() -> None:
    model = WarmingModel()
    settings = EngineSettings(model="/m", kind="exllamav3", exllamav3={"warmup": False})
    assert backend.warm_up(model, object(), settings, draft_size=0) == {} and model.calls == []


# --- a fake exllamav3 -----------------------------------------------------------------------------


@dataclass(eq=False)
class FakeJob:
    kwargs: dict[str, Any]
    produced: int = 0

    @property
    def prompt(self) -> list[int]:
        return [int(t) for t in self.kwargs["input_ids"][0]]


class FakeFilter:
    def __init__(self, tokenizer: Any, trigger: Any, prefix: Any, eos_after: bool) -> None:
        self.tokenizer = tokenizer


@dataclass
class FakeGenerator:
    """Each job's reply: prompt[-1] + 1, + 2 …; two tokens per iterate; stop tokens end it."""

    tokenizer: Any = None
    jobs: list[FakeJob] = field(default_factory=list)
    cancelled: list[FakeJob] = field(default_factory=list)
    seen: list[FakeJob] = field(default_factory=list)
    batches: list[int] = field(default_factory=list)
    """How many jobs each ``iterate`` call found."""
    cached: int = 0
    closed: int = 0
    """How many times ``close`` was called (exllamav3's releases the generator's host memory)."""

    def enqueue(self, job: FakeJob) -> None:
        if len(job.prompt) > 1000:
            raise ValueError("job too large for the cache")
        self.jobs.append(job)
        self.seen.append(job)

    def cancel(self, job: FakeJob) -> None:
        self.jobs.remove(job)
        self.cancelled.append(job)

    def num_remaining_jobs(self) -> int:
        return len(self.jobs)

    def close(self) -> None:
        self.closed += 1

    def get_cache_stats(self) -> dict[str, int]:
        return {"max_tokens": 4096, "free_tokens": 4096 - 256 * len(self.jobs), "cached_tokens": 512}

    def iterate(self) -> list[dict[str, Any]]:
        self.batches.append(len(self.jobs))
        if any(job.kwargs["seed"] > 2**63 - 1 for job in self.jobs):
            raise OverflowError("Overflow when unpacking long long")  # torch, inside a step
        results = []
        for job in list(self.jobs):
            out = []
            eos: dict[str, Any] = {}
            for _ in range(2):
                job.produced += 1
                token = job.prompt[-1] + job.produced
                for flt in job.kwargs.get("filters", []):  # as exllamav3: its mask, then accept
                    allowed = [
                        i for i in range(flt.matcher.vocab_size) if _allows(flt.get_next_logit_mask(), i)
                    ]
                    token = allowed[0]  # (greedy on a flat distribution)
                    flt.accept_token(token)
                if token in job.kwargs["stop_conditions"]:
                    eos = {"eos_reason": "stop_token", "eos_triggering_token_id": token}
                    break
                out.append(token)
                if job.produced >= job.kwargs["max_new_tokens"]:
                    eos = {"eos_reason": "max_new_tokens"}
                    break
            result: dict[str, Any] = {"job": job, "eos": bool(eos), **eos}
            if out:
                result["token_ids"] = torch.tensor([out])
            if eos:
                result |= {
                    "cached_tokens": self.cached,
                    "accepted_draft_tokens": 3,
                    "rejected_draft_tokens": 1,
                    "time_enqueued": 0.5,
                    "time_prefill": 0.25,
                    "time_generate": 1.0,
                }
                self.jobs.remove(job)
            results.append(result)
        return results


def _allows(mask: torch.Tensor, token: int) -> bool:
    return bool((int(mask[0, token >> 5]) >> (token & 31)) & 1)


FAKE_EXL = SimpleNamespace(
    Job=lambda **kwargs: FakeJob(kwargs),
    ArgmaxSampler=lambda: "argmax",
    ComboSampler=lambda **kwargs: ("combo", kwargs),
    Filter=FakeFilter,
)


class Tok:
    chat_template = None
    eos_token = "<eos>"

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(chr(i) for i in ids)


def make(
    parallel: int = 2, plain: bool = False, gather_s: float = 0.0
) -> tuple[backend.Exllamav3Generator, dict[str, FakeGenerator]]:
    fakes = {"main": FakeGenerator(cached=256)}
    lanes = [backend.Lane("main", fakes["main"], 4096, drafts=plain)]
    if plain:
        fakes["plain"] = FakeGenerator()
        lanes.append(backend.Lane("plain", fakes["plain"], 1024))
    generator = backend.Exllamav3Generator(
        FAKE_EXL,
        torch,
        lanes,
        Tok(),
        context_length=2048,
        parallel=parallel,
        eos_token_ids=frozenset({99}),
        vocab_size=128,
        gather_s=gather_s,
    )
    return generator, fakes


async def collect(
    generator: backend.Exllamav3Generator, prompt: list[int], params: SamplingParams
) -> list[int]:
    return [t async for t in generator.generate(prompt, params, threading.Event())]


def test_a_request_runs_as_an_exllamav3_job_and_reports_cache_and_drafts() -> None:
    generator, _ = make()
    params = SamplingParams(max_tokens=5)
    try:
        tokens = asyncio.run(collect(generator, [10, 20], params))
    finally:
        generator.close()
    assert tokens == [21, 22, 23, 24, 25]
    assert params.report.cached_tokens == 256 and params.report.drafted == 4 and params.report.accepted == 3
    assert params.report.phases_s == {"queued": 0.5, "prefill": 0.25, "generate": 1.0}


def test_closing_the_engine_closes_each_lanes_exllamav3_generator_once() -> None:
    generator, fakes = make(plain=True)
    generator.close()
    assert {name: fake.closed for name, fake in fakes.items()} == {"main": 1, "plain": 1}


def test_the_stop_token_exllamav3_holds_back_is_handed_to_the_server() -> None:
    generator, _ = make()
    try:
        tokens = asyncio.run(collect(generator, [96], SamplingParams(max_tokens=10)))
    finally:
        generator.close()
    assert tokens == [97, 98, 99]  # 99 = eos ends the reply, and the server sees it


def test_ignore_eos_keeps_eos_out_of_the_stop_conditions() -> None:
    assert backend.stop_ids(SamplingParams(max_tokens=1, ignore_eos=True), frozenset({99})) == []
    params = SamplingParams(max_tokens=1, stop_token_ids=frozenset({7}))
    assert backend.stop_ids(params, frozenset({99})) == [7, 99]


def test_sampling_maps_to_exllamav3_samplers() -> None:
    assert backend.sampler_for(FAKE_EXL, SamplingParams(max_tokens=1, temperature=0)) == "argmax"
    kind, kwargs = backend.sampler_for(FAKE_EXL, SamplingParams(max_tokens=1, temperature=0.7, top_k=5))
    assert kind == "combo" and kwargs["temperature"] == 0.7 and kwargs["top_k"] == 5


def test_past_parallel_requests_get_capacity_errors() -> None:
    generator, _ = make(parallel=1)

    async def two() -> list[Any]:
        return await asyncio.gather(
            collect(generator, [1], SamplingParams(max_tokens=50)),
            collect(generator, [2], SamplingParams(max_tokens=50)),
            return_exceptions=True,
        )

    try:
        outcomes = asyncio.run(two())
    finally:
        generator.close()
    assert sum(isinstance(o, CapacityError) for o in outcomes) == 1
    assert sum(isinstance(o, list) and len(o) == 50 for o in outcomes) == 1


async def _staggered(generator: backend.Exllamav3Generator, prompts: list[int], gap_s: float) -> list[Any]:
    """One request per prompt, each sent ``gap_s`` after the one before."""

    async def one(n: int, prompt: int) -> list[int]:
        await asyncio.sleep(n * gap_s)
        return await collect(generator, [prompt], SamplingParams(max_tokens=4))

    return await asyncio.gather(*(one(n, p) for n, p in enumerate(prompts)))


def test_an_idle_engine_gathers_a_burst_into_its_first_step() -> None:
    # requests 50 ms apart, a 0.5 s gather: all three are enqueued before the first iterate
    # (without the gather the first request would start alone and the others wait for the cooldown)
    generator, fakes = make(parallel=4, gather_s=0.5)
    try:
        replies = asyncio.run(_staggered(generator, [10, 20, 30], gap_s=0.05))
    finally:
        generator.close()
    assert replies == [[11, 12, 13, 14], [21, 22, 23, 24], [31, 32, 33, 34]]
    assert fakes["main"].batches[0] == 3


def test_the_gather_ends_once_every_lane_is_taken() -> None:
    # a 60 s gather would outlast the bound below unless a full house ends it
    generator, fakes = make(parallel=2, gather_s=60)

    async def two() -> list[Any]:
        return await asyncio.wait_for(_staggered(generator, [10, 20], gap_s=0.01), timeout=20)

    try:
        assert asyncio.run(two()) == [[11, 12, 13, 14], [21, 22, 23, 24]]
    finally:
        generator.close()
    assert fakes["main"].batches[0] == 2


def test_a_job_exllamav3_refuses_fails_alone() -> None:
    generator, _ = make()
    try:
        with pytest.raises(CapacityError, match="KV pool"):
            asyncio.run(collect(generator, list(range(2000)), SamplingParams(max_tokens=5)))
        assert asyncio.run(collect(generator, [1], SamplingParams(max_tokens=2))) == [2, 3]
        assert generator.healthy()
    finally:
        generator.close()


def test_a_step_that_raises_fails_its_lanes_requests_not_the_engine() -> None:
    generator, _ = make()

    async def bounded(prompt: list[int], params: SamplingParams) -> list[int]:
        return await asyncio.wait_for(collect(generator, prompt, params), timeout=20)

    try:
        with pytest.raises(EngineFailure, match="Overflow"):
            asyncio.run(bounded([1], SamplingParams(max_tokens=5, temperature=1.0, seed=2**64)))
        assert generator.healthy()
        assert asyncio.run(bounded([1], SamplingParams(max_tokens=2))) == [2, 3]
    finally:
        generator.close()


def test_draft_false_runs_on_the_plain_lane() -> None:
    generator, fakes = make(plain=True)
    try:
        asyncio.run(collect(generator, [1], SamplingParams(max_tokens=3, draft=False)))
        asyncio.run(collect(generator, [1], SamplingParams(max_tokens=3)))
    finally:
        generator.close()
    assert [job.kwargs["max_new_tokens"] for job in fakes["plain"].seen] == [3]
    assert len(fakes["main"].seen) == 1


def test_a_client_that_leaves_cancels_its_job() -> None:
    generator, fakes = make()

    async def leave_early() -> None:
        # from 100 up the fake never reaches the stop id 99: only the cancel can end the job
        stream = generator.generate([100], SamplingParams(max_tokens=10_000), threading.Event())
        async for _ in stream:
            break
        await stream.aclose()

    try:
        asyncio.run(leave_early())
        deadline = asyncio.run(_poll(lambda: bool(fakes["main"].cancelled)))
    finally:
        generator.close()
    assert deadline


async def _poll(check: Any, seconds: float = 10) -> bool:
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while loop.time() < end:
        if check():
            return True
        await asyncio.sleep(0.01)
    return False


def test_pool_stats_reach_health_and_metrics() -> None:
    generator, _ = make()
    try:
        assert asyncio.run(_poll(lambda: bool(generator.pool_stats())))
        stats = generator.pool_stats()
        text = generator.metrics_text()
    finally:
        generator.close()
    assert stats["pool_tokens"] == 4096 and stats["kept_tokens"] == 512 and stats["lanes"] == 2
    assert "sparkfold_exllamav3_free_tokens 4096" in text


def test_the_grammar_filter_hands_exllamav3_the_matchers_bitmask() -> None:
    class Matcher:
        vocab_size = 64
        active = False
        rolled = 0

        def fill_bitmask(self, mask: torch.Tensor, index: int) -> bool:
            if not self.active:
                return False
            mask.zero_()
            mask[0, 0] = 1 << 5
            return True

        def rollback(self, count: int) -> None:
            self.rolled += count

    matcher = Matcher()
    flt = backend.matcher_filter(FAKE_EXL, Tok(), matcher)
    assert flt.get_next_logit_mask().eq(-1).all()  # inactive: everything allowed
    matcher.active = True
    mask = flt.get_next_logit_mask()
    assert mask.shape == allocate_bitmask(64).shape and int(mask[0, 0]) == 32
    assert flt.rollback_tokens(2) and matcher.rolled == 2 and not flt.is_completed()


def test_engine_settings_carry_the_exllamav3_section() -> None:
    settings = EngineSettings(model="/m", kind="exllamav3", exllamav3={"cache": "q4", "mtp": True})
    assert settings.exllamav3.cache == "q4" and settings.exllamav3.drafts


def test_the_server_reports_pool_and_cached_tokens() -> None:
    from fastapi.testclient import TestClient

    from sparkfold.engines.server import create_app
    from sparkfold.engines.service import EngineService

    generator, _ = make()
    service = EngineService(generator, served_name="glm", max_tokens=4, seed=0, thinking=False)
    try:
        with TestClient(create_app(service)) as http:
            reply = http.post(
                "/v1/completions", json={"prompt": "ab", "max_tokens": 4, "temperature": 0}
            ).json()
            health = http.get("/health").json()
            metrics = http.get("/metrics").text
    finally:
        generator.close()
    assert reply["usage"]["prompt_tokens_details"]["cached_tokens"] == 256
    assert reply["tensorfold"]["cached"] == 256 and reply["tensorfold"]["accepted"] == 3
    assert health["pool"]["pool_tokens"] == 4096 and health["cached_tokens_total"] == 256
    assert "sparkfold_exllamav3_pool_tokens 4096" in metrics
    assert "tensorfold:prompt_tokens_cached_total 256.0" in metrics


# --- pictures -------------------------------------------------------------------------------------


def test_each_placeholder_run_becomes_its_pictures_embedding_ids() -> None:
    prompt = [1, 7, 7, 2, 7, 7, 7, 3]
    spliced = backend.splice_embeddings(prompt, 7, [range(100, 102), range(200, 203)])
    assert spliced == [1, 100, 101, 2, 200, 201, 202, 3]


@pytest.mark.parametrize(
    "spans", [[range(100, 101), range(200, 203)], [range(100, 102)], [range(0, 2), range(5, 8), range(9, 10)]]
)
def test_a_picture_whose_size_does_not_match_its_placeholders_is_refused(spans: list[range]) -> None:
    with pytest.raises(ValueError):
        backend.splice_embeddings([1, 7, 7, 2, 7, 7, 7, 3], 7, spans)


class FakeVision:
    """A vision tower: each picture (an int here) becomes an embedding of that many rows."""

    def __init__(self) -> None:
        self.next_index = 1_000_000_000
        self.config = SimpleNamespace(vision=SimpleNamespace(spatial_merge_size=2, temporal_patch_size=2))

    def preprocess(self, image: int) -> tuple[None, None, tuple[int, int, int]]:
        return None, None, (1, 2, 2 * image)

    def get_image_embeddings(self, tokenizer: Any, image: int) -> SimpleNamespace:
        first = self.next_index
        self.next_index += image
        return SimpleNamespace(first_index=first, last_index=first + image)


class PictureTok(Tok):
    def convert_tokens_to_ids(self, token: str) -> int:
        return {"<|begin_of_video|>": 8, "<|end_of_video|>": 9}.get(token, 7)  # 7: <|image|>


def with_vision(
    fake: FakeGenerator, vision: FakeVision, glm: Any = None, exl: Any = FAKE_EXL
) -> backend.Exllamav3Generator:
    """The engine on ``fake`` with the vision tower ``vision`` (and the GLM protocol ``glm``)."""
    return backend.Exllamav3Generator(
        exl,
        torch,
        [backend.Lane("main", fake, 4096)],
        PictureTok(),
        context_length=2048,
        parallel=2,
        eos_token_ids=frozenset({99}),
        vocab_size=128,
        glm=glm,
        vision=vision,
    )


def test_pictures_reach_the_job_as_embeddings_spliced_into_the_prompt() -> None:
    fake = FakeGenerator()
    vision = FakeVision()
    generator = with_vision(fake, vision)
    measured = backend.VisionPreprocessor(vision, torch)([3])
    assert measured["image_grid_thw"].tolist() == [[1, 2, 6]] and measured["pixel_values"] == [3]
    try:
        params = SamplingParams(max_tokens=2, temperature=0.0, prefill_inputs={"pixel_values": [3]})
        asyncio.run(collect(generator, [1, 7, 7, 7, 2], params))
    finally:
        generator.close()
    job = fake.seen[0]
    assert job.prompt == [1, 1_000_000_000, 1_000_000_001, 1_000_000_002, 2]
    assert [e.first_index for e in job.kwargs["embeddings"]] == [1_000_000_000]


def test_a_grammar_dead_end_ends_the_reply_with_its_error_not_the_lane() -> None:
    # main: the filter handed exllamav3 an all-zero mask (every logit -inf) and the step sampled from it
    from tests.fakes.small_vocab import STOP, small_matcher

    from sparkfold.glm.errors import GrammarDeadEnd

    generator, _ = make()
    tokens: list[int] = []

    async def run(params: SamplingParams) -> None:
        async for token in generator.generate([1], params, threading.Event()):
            tokens.append(token)

    dead = SamplingParams(
        max_tokens=8, stop_token_ids=frozenset({STOP}), constraint=small_matcher('root ::= "A" "!"')
    )
    fine = SamplingParams(
        max_tokens=8, stop_token_ids=frozenset({STOP}), constraint=small_matcher('root ::= "AB"')
    )
    try:
        with pytest.raises(GrammarDeadEnd, match="allows no token after 1 tokens"):
            asyncio.run(run(dead))
        assert tokens == [0]  # "A"; the stop offered in the dead end's place is not the reply's
        tokens.clear()
        asyncio.run(run(fine))
    finally:
        generator.close()
    assert tokens == [0, 1, STOP]


def test_the_grammar_filter_offers_only_the_stops_at_a_dead_end() -> None:
    from tests.fakes.small_vocab import SIZE, STOP, small_matcher

    flt = backend.matcher_filter(FAKE_EXL, Tok(), small_matcher('root ::= "A" "!"'))
    assert [i for i in range(SIZE) if _allows(flt.get_next_logit_mask(), i)] == [0]
    flt.accept_token(0)
    assert [i for i in range(SIZE) if _allows(flt.get_next_logit_mask(), i)] == [STOP]
    assert flt.matcher.dead_end is not None
