"""Log-probabilities from the exllamav3 engine on the GPU (exllamav3's own top tokens and
probabilities, :mod:`sparkfold.engines.exllamav3.logprobs`), through the engine core (the
default) and in the server's process; the gateway with the openai SDK is in ``test_gateway_sdks``.
"""

from __future__ import annotations

import json
import math
from typing import Any

import httpx
import pytest
from gpu_engine import Results

TOP = 5
ASK = [{"role": "user", "content": "Name the colours of the rainbow"}]


def described(entries: int, completion_tokens: int) -> bool:
    """One entry per reply token; the token that ends a reply (counted in usage) has none."""
    return entries > 0 and completion_tokens - 1 <= entries <= completion_tokens


def check_entries(content: list[dict[str, Any]]) -> None:
    """Each token: a log-probability <= 0 and TOP alternatives, best first, whose probabilities sum
    to <= 1; at temperature 0 the token is the likeliest one."""
    assert content
    for entry in content:
        top = entry["top_logprobs"]
        assert entry["logprob"] <= 0 and len(top) == TOP, entry
        assert sum(math.exp(t["logprob"]) for t in top) <= 1 + 1e-4, entry
        assert [t["logprob"] for t in top] == sorted((t["logprob"] for t in top), reverse=True)
        assert math.isclose(entry["logprob"], top[0]["logprob"], abs_tol=1e-5), entry


def same(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
    """Token for token the same, alternatives included (log-probabilities to 1e-4)."""

    def key(entries: list[dict[str, Any]]) -> list[Any]:
        return [(e["token"], [t["token"] for t in e["top_logprobs"]]) for e in entries]

    def values(entries: list[dict[str, Any]]) -> list[float]:
        return [lp for e in entries for lp in [e["logprob"], *(t["logprob"] for t in e["top_logprobs"])]]

    close = all(math.isclose(x, y, abs_tol=1e-4) for x, y in zip(values(a), values(b), strict=True))
    return key(a) == key(b) and close


def streamed(client: httpx.Client, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    chunks = []
    with client.stream("POST", path, json=body | {"stream": True}) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("data: {"):
                chunks.append(json.loads(line.removeprefix("data: ")))
    return [c for chunk in chunks for c in chunk["choices"]]


def test_chat_logprobs_streamed_and_not_agree(
    any_client: httpx.Client, results: Results, request: pytest.FixtureRequest
) -> None:
    body = {"messages": ASK, "max_tokens": 12, "temperature": 0, "logprobs": True, "top_logprobs": TOP}
    response = any_client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    reply = response.json()
    content = reply["choices"][0]["logprobs"]["content"]
    check_entries(content)
    assert described(len(content), reply["usage"]["completion_tokens"])
    stream = [
        e
        for c in streamed(any_client, "/v1/chat/completions", body)
        for e in (c.get("logprobs") or {}).get("content") or []
    ]
    where = request.node.callspec.params["any_client"]
    results.record(f"logprobs_chat_{where}", [[e["token"], round(e["logprob"], 4)] for e in content])
    assert same(stream, content)


def test_completion_logprobs_streamed_and_not_agree(any_client: httpx.Client) -> None:
    body = {"prompt": "The history of the river begins", "max_tokens": 12, "temperature": 0, "logprobs": TOP}
    response = any_client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    columns = choice["logprobs"]
    assert described(len(columns["tokens"]), response.json()["usage"]["completion_tokens"])
    for logprob, top in zip(columns["token_logprobs"], columns["top_logprobs"], strict=True):
        assert logprob <= 0 and 0 < len(top) <= TOP  # distinct token texts (a dict)
        assert sum(math.exp(v) for v in top.values()) <= 1 + 1e-4
    stream = streamed(any_client, "/v1/completions", body)
    tokens = [t for c in stream for t in (c.get("logprobs") or {}).get("tokens") or []]
    values = [v for c in stream for v in (c.get("logprobs") or {}).get("token_logprobs") or []]
    assert tokens == columns["tokens"]
    assert all(
        math.isclose(a, b, abs_tol=1e-4) for a, b in zip(values, columns["token_logprobs"], strict=True)
    )
