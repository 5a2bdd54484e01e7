"""The exllamav3 engine's serving warm-up without a GPU: the plan's shapes, and its run through a fake
generator (the GPU side: ``tests/gpu/test_exllamav3_warm.py``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from sparkfold.engines import exllamav3 as backend


def test_the_plan_decodes_at_every_batch_size_below_and_past_the_sparse_threshold() -> None:
    rounds = backend.serving_plan(parallel=4, chunk_tokens=1024, window=65_536, sparse_after=2048)
    assert rounds[0].label == "prompt tails"
    short = [r for r in rounds if r.label.startswith("decode batch")]
    long = [r for r in rounds if r.label.startswith("long prompt")]
    assert [len(r.jobs) for r in short] == [1, 2, 3, 4]
    assert all(job.prompt_tokens + job.new_tokens <= 2048 for r in short for job in r.jobs)  # dense
    assert [len(r.jobs) for r in long] == [1, 2, 3, 4]
    for round_ in long:
        prompt, *streams = round_.jobs
        assert prompt.prompt_tokens > 2048  # past the threshold: the sparse regime
        assert prompt.prompt_tokens > 2 * 1024 and prompt.prompt_tokens % 1024  # chunks, a ragged last one
        chunks = math.ceil(prompt.prompt_tokens / 1024)
        # the streams still decode once the prompt is read (one chunk a step) and its tokens come
        assert all(s.new_tokens >= chunks + prompt.new_tokens for s in streams)


def test_the_prompt_tails_read_every_length_class_a_short_prefill_compiles_for() -> None:
    (tails,) = [r for r in backend.serving_plan(2, 2048, 65_536, 2048) if r.label == "prompt tails"]
    lengths = [job.prompt_tokens for job in tails.jobs]
    for passed in (lengths, [n - 1 for n in lengths]):  # the pass may leave the last token to decode
        classes = {(1 << (n - 1).bit_length(), n % 16 == 0) for n in passed if n > 1}
        expected = {(1 << k, False) for k in range(1, 9)} | {(1 << k, True) for k in range(4, 9)}
        assert classes >= expected, sorted(expected - classes)


def test_without_sparse_attention_the_long_prompt_is_still_several_chunks() -> None:
    rounds = backend.serving_plan(parallel=2, chunk_tokens=2048, window=1_048_576, sparse_after=None)
    prompt = rounds[-1].jobs[0]
    assert 2048 < prompt.prompt_tokens < 2 * 2048 and len(rounds) == 5


def test_with_a_smaller_shared_chunk_the_streams_outlast_the_longer_prefill() -> None:
    rounds = backend.serving_plan(4, 2048, 1_048_576, 2048, shared_tokens=512)
    prompt, *streams = rounds[-1].jobs
    assert all(s.new_tokens >= math.ceil(prompt.prompt_tokens / 512) + prompt.new_tokens for s in streams)


def test_the_long_prompt_fits_the_window() -> None:
    rounds = backend.serving_plan(parallel=1, chunk_tokens=2048, window=3000, sparse_after=2048)
    prompt = rounds[-1].jobs[0]
    assert prompt.prompt_tokens + prompt.new_tokens <= 3000


@dataclass
class Lane:
    """A generator that finishes every job's prompt in one step and decodes one token a step;
    records the jobs decoding together at each step."""

    refuse_over: int = 10_000
    jobs: list[Any] = field(default_factory=list)
    decoding: list[list[int]] = field(default_factory=list)
    cleared: int = 0

    def enqueue(self, job: Any) -> None:
        if job.kwargs["input_ids"].shape[1] > self.refuse_over:
            raise ValueError("job too large for the cache")
        job.left = job.kwargs["max_new_tokens"]
        self.jobs.append(job)

    def num_remaining_jobs(self) -> int:
        return len(self.jobs)

    def iterate(self) -> None:
        self.decoding.append(sorted(int(job.kwargs["input_ids"].shape[1]) for job in self.jobs))
        for job in list(self.jobs):
            job.left -= 1
            if not job.left:
                self.jobs.remove(job)

    def clear_queue(self) -> None:
        self.jobs.clear()
        self.cleared += 1


EXL = SimpleNamespace(
    Job=lambda **kwargs: SimpleNamespace(kwargs=kwargs),
    ArgmaxSampler=lambda: "argmax",
    ComboSampler=lambda **kwargs: ("combo", kwargs),
)


def test_each_lane_runs_every_round_with_random_prompts_and_no_stops() -> None:
    rounds = backend.serving_plan(parallel=3, chunk_tokens=256, window=8192, sparse_after=64)
    lanes = [Lane(), Lane()]
    warmed = backend.warm_lanes(EXL, torch, lanes, rounds, vocab_size=50)
    assert warmed["serving_warmup_failed"] == [] and warmed["serving_warmup_s"] >= 0
    for lane in lanes:
        assert not lane.jobs
        widths = {len(step) for step in lane.decoding}
        assert widths >= {1, 2, 3}  # every batch size up to parallel decoded together
        long = rounds[-1].jobs[0].prompt_tokens
        assert [40, 41, long] in [sorted(step) for step in lane.decoding]  # the long prompt beside two


def test_a_round_that_raises_is_a_warning_and_the_rest_still_run(caplog: pytest.LogCaptureFixture) -> None:
    rounds = backend.serving_plan(parallel=2, chunk_tokens=256, window=8192, sparse_after=None)
    lane = Lane(refuse_over=300)  # the long prompts are refused
    with caplog.at_level("WARNING"):
        warmed = backend.warm_lanes(EXL, torch, [lane], rounds, vocab_size=50)
    assert [f.split(":")[0] for f in warmed["serving_warmup_failed"]] == [
        "long prompt beside 0",
        "long prompt beside 1",
    ]
    assert lane.cleared == 2 and not lane.jobs
    assert {1, 2} <= {len(step) for step in lane.decoding}  # the short rounds ran
    assert "2 round(s) raised (long prompt beside 0: job too large" in caplog.text


def test_warm_up_jobs_are_random_ids_in_the_vocabulary_sampled_greedy_and_not() -> None:
    seen: list[Any] = []

    class Recording(Lane):
        def enqueue(self, job: Any) -> None:
            seen.append(job)
            super().enqueue(job)

    backend.warm_lanes(
        EXL, torch, [Recording()], backend.serving_plan(2, 256, 8192, None)[1:3], vocab_size=50
    )
    assert all(job.kwargs["stop_conditions"] == [] for job in seen)
    assert all(
        int(job.kwargs["input_ids"].min()) >= 0 and int(job.kwargs["input_ids"].max()) < 50 for job in seen
    )
    assert {job.kwargs["sampler"] == "argmax" for job in seen} == {True, False}
