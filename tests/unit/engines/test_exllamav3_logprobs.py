"""The exllamav3 engine's log-probabilities without a GPU: exllamav3's result dicts (as
``exllamav3/generator/job.py`` builds them with ``return_probs`` / ``return_top_tokens``) in, the
OpenAI shapes of ``sparkfold.engines.logprobs`` out, and the engine's card saying it serves them."""

from __future__ import annotations

import json
import math
from typing import Any

import torch
from fastapi.testclient import TestClient
from tests.unit.engines.test_exllamav3 import FAKE_EXL, FakeGenerator, FakeJob, Tok

from sparkfold.engines import exllamav3 as backend
from sparkfold.engines.exllamav3.logprobs import LOG_ZERO, token_logprobs
from sparkfold.engines.generator import SamplingParams, TokenLogprob
from sparkfold.engines.server import create_app
from sparkfold.engines.service import EngineService


def probabilities(tokens: list[int], top: int) -> dict[str, Any]:
    """What exllamav3 adds to a result for these tokens: each chosen at 1/2, its top ``top`` halving."""
    probs = [0.5 / 2**i for i in range(top)]
    return {
        "token_probs": torch.full((1, len(tokens)), 0.5),
        "top_k_tokens": torch.tensor([[[t + i for i in range(top)] for t in tokens]], dtype=torch.long),
        "top_k_probs": torch.tensor([[probs for _ in tokens]]),
    }


class ProbGenerator(FakeGenerator):
    """The fake generator of ``test_exllamav3``, with probabilities when the job asks for them;
    a stop token travels in the last result's ``held`` block, as in exllamav3."""

    def iterate(self) -> list[dict[str, Any]]:
        results = super().iterate()
        for result in results:
            job: FakeJob = result["job"]
            if not job.kwargs.get("return_probs"):
                continue
            top = job.kwargs["return_top_tokens"]
            if "token_ids" in result:
                result |= probabilities(result["token_ids"].flatten().tolist(), top)
            stop = result.get("eos_triggering_token_id")
            if stop is not None:
                result["held"] = {"token_ids": torch.tensor([[stop]]), **probabilities([stop], top)}
        return results


class ChatTok(Tok):
    chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}"


def make() -> backend.Exllamav3Generator:
    return backend.Exllamav3Generator(
        FAKE_EXL,
        torch,
        [backend.Lane("main", ProbGenerator(), 4096)],
        ChatTok(),
        context_length=2048,
        parallel=2,
        eos_token_ids=frozenset({99}),
        vocab_size=128,
    )


def test_each_token_gets_its_log_probability_and_the_top_alternatives() -> None:
    result = {"token_ids": torch.tensor([[5, 9]]), **probabilities([5, 9], 3)}
    result["token_probs"] = torch.tensor([[0.5, 0.0]])
    entries = token_logprobs(result)
    assert [e.token for e in entries] == [5, 9]
    assert entries[0].logprob == math.log(0.5) and entries[1].logprob == LOG_ZERO  # no -inf in JSON
    assert entries[0].top == ((5, math.log(0.5)), (6, math.log(0.25)), (7, math.log(0.125)))
    assert token_logprobs({}) == []


def test_the_job_asks_exllamav3_for_probabilities_only_when_the_request_does() -> None:
    def job(**params: Any) -> dict[str, Any]:
        made = backend.job_for(
            FAKE_EXL,
            torch,
            [1],
            SamplingParams(max_tokens=4, **params),
            eos_token_ids=frozenset(),
            tokenizer=None,
            stop_on_loop=False,
        )
        return dict(made.kwargs)

    assert "return_probs" not in job() and "return_top_tokens" not in job()
    assert job(logprobs=0)["return_probs"] is True and job(logprobs=0)["return_top_tokens"] == 0
    assert job(logprobs=5)["return_top_tokens"] == 5


def test_the_engine_fills_one_entry_per_token_and_one_for_the_held_stop_token() -> None:
    import asyncio
    import threading

    generator = make()
    params = SamplingParams(max_tokens=10, logprobs=2)

    async def collect() -> list[int]:
        return [t async for t in generator.generate([96], params, threading.Event())]

    try:
        tokens = asyncio.run(collect())
    finally:
        generator.close()
    assert tokens == [97, 98, 99]
    assert [e.token for e in params.logprobs_out] == tokens
    assert params.logprobs_out[-1] == TokenLogprob(
        99, math.log(0.5), ((99, math.log(0.5)), (100, math.log(0.25)))
    )


def served() -> tuple[TestClient, backend.Exllamav3Generator]:
    generator = make()
    service = EngineService(generator, served_name="glm", max_tokens=4, seed=0, thinking=False)
    return TestClient(create_app(service)), generator


def test_the_card_says_logprobs_and_both_shapes_come_back_streamed_or_not() -> None:
    http, generator = served()
    body = {"messages": [{"role": "user", "content": "A"}], "max_tokens": 4, "temperature": 0}
    body |= {"logprobs": True, "top_logprobs": 2}
    try:
        with http:
            card = http.get("/v1/models").json()["data"][0]
            reply = http.post("/v1/chat/completions", json=body)
            chunks = []
            with http.stream("POST", "/v1/chat/completions", json=body | {"stream": True}) as stream:
                for line in stream.iter_lines():
                    if line.startswith("data: {"):
                        chunks.append(json.loads(line.removeprefix("data: ")))
            completion = http.post(
                "/v1/completions", json={"prompt": "AB", "max_tokens": 3, "temperature": 0, "logprobs": 2}
            )
    finally:
        generator.close()
    assert card["capabilities"]["logprobs"] is True
    assert reply.status_code == 200, reply.text
    content = reply.json()["choices"][0]["logprobs"]["content"]
    assert len(content) == 4 and all(c["logprob"] == math.log(0.5) for c in content)
    assert all(len(c["top_logprobs"]) == 2 for c in content)
    streamed = [
        c
        for chunk in chunks
        for choice in chunk["choices"]
        for c in (choice.get("logprobs") or {}).get("content") or []
    ]
    assert streamed == content
    assert completion.status_code == 200, completion.text
    columns = completion.json()["choices"][0]["logprobs"]
    assert columns["token_logprobs"] == [math.log(0.5)] * 3
    assert [len(top) for top in columns["top_logprobs"]] == [2, 2, 2]
