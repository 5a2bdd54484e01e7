"""The conformance suite passes a server that keeps the contract and fails each broken clause.

The server here is a contract double on httpx.MockTransport (no sockets, no model): it answers
like an engine server with a fixed reply. Each ``broken`` variant violates one clause, and the
suite must name exactly that check. The suite against the real transformers engine lives in
tests/integration.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from sparkfold.conformance import run

CONTEXT = 64
REPLY = ["Hel", "lo", "!"]


def contract_double(broken: str = "", declares_n: bool = False) -> httpx.MockTransport:
    """``declares_n``: the model card declares ``capabilities.n`` (our engines); ``broken="n"`` then
    answers one choice where two were asked for, and without it answers ``n = 2`` at all."""

    def error(status: int, message: str, code: str | None = None) -> httpx.Response:
        body = {"error": {"message": message, "type": "invalid_request_error", "code": code}}
        return httpx.Response(status, json=body)

    def usage(completion: int) -> dict[str, int]:
        total = 3 + completion + (1 if broken == "usage_sum" else 0)
        return {"prompt_tokens": 3, "completion_tokens": completion, "total_tokens": total}

    held = {"streams": 0, "after_hold": False}

    def chat(body: dict[str, Any]) -> httpx.Response:
        if body.get("stream"):
            held["streams"] += 1  # broken "leaks_lanes": never counted down
            if held["after_hold"] and not body.get("ignore_eos") and broken == "refuses_after_hangup":
                held["after_hold"] = False
                refusal = (
                    b'data: {"error":{"message":"the engine runs 1 requests already"}}\n\ndata: [DONE]\n\n'
                )
                return httpx.Response(200, content=refusal, headers={"content-type": "text/event-stream"})
            held["after_hold"] = bool(body.get("ignore_eos"))
        if not isinstance(body.get("messages"), list):
            return error(400, "messages: Input should be a valid list")
        choices = body.get("n", 1)
        if choices != 1 and not declares_n and broken != "n":
            return error(400, "n: only n = 1 is supported")
        if broken == "n":
            choices = 1
        budget = body.get("max_tokens", 16)
        if 3 + budget > CONTEXT and broken != "context":
            return error(
                400, f"This server's maximum context length is {CONTEXT} tokens", "context_length_exceeded"
            )
        pieces = REPLY[:budget]
        if not body.get("stream"):
            message = {"role": "assistant", "content": "".join(pieces)}
            listed = [{"index": i, "message": message, "finish_reason": "stop"} for i in range(choices)]
            return httpx.Response(
                200,
                json={
                    "id": "x",
                    "object": "chat.completion",
                    "choices": listed,
                    "usage": usage(len(pieces)),
                },
            )
        chunks: list[dict[str, Any]] = [{"role": "assistant"}] + [{"content": p} for p in pieces]
        events = []
        for i, delta in enumerate(chunks):
            last = i == len(chunks) - 1
            choice = {"index": 0, "delta": delta, "finish_reason": "stop" if last else None}
            chunk: dict[str, Any] = {"id": "x", "object": "chat.completion.chunk", "choices": [choice]}
            if last:
                chunk["usage"] = usage(len(pieces))
            events.append(f"data: {json.dumps(chunk)}\n\n")
        if broken != "done":
            events.append("data: [DONE]\n\n")
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, text="".join(events))

    def handler(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/health":
            return httpx.Response(
                200,
                json={
                    "ok": broken != "health",
                    "requests_running": held["streams"] if broken == "leaks_lanes" else 0,
                    "requests_total": 1,
                    "prompt_tokens_total": 3,
                    "completion_tokens_total": 3,
                    "context_length": CONTEXT,
                },
            )
        if path == "/v1/models":
            card = {"id": "demo", "object": "model"}
            if declares_n:
                card["capabilities"] = {"backend": "double", "n": True}
            return httpx.Response(200, json={"object": "list", "data": [card]})
        if path == "/metrics":
            return httpx.Response(200, text="# TYPE requests_total counter\nrequests_total 1\n")
        if path == "/v1/chat/completions":
            try:
                return chat(json.loads(request.content))
            except json.JSONDecodeError:
                return error(400, "body is not valid JSON")
        if path == "/v1/completions":
            choice = {"index": 0, "text": " Paris", "finish_reason": "length"}
            return httpx.Response(
                200, json={"object": "text_completion", "choices": [choice], "usage": usage(1)}
            )
        return error(404, f"no route {path}")

    return httpx.MockTransport(handler)


def verdicts(broken: str = "", declares_n: bool = False) -> dict[str, bool]:
    return {r.name: r.passed for r in run("http://engine", transport=contract_double(broken, declares_n))}


@pytest.mark.parametrize("declares_n", [False, True], ids=["tensorfold", "capabilities.n"])
def test_a_conforming_server_passes_every_required_check(declares_n: bool) -> None:
    results = run("http://engine", transport=contract_double(declares_n=declares_n))
    assert all(r.passed for r in results if r.required), [r for r in results if not r.passed]
    # the double lacks the optional vLLM /tokenize and include_usage additions: reported, not required
    assert {r.name for r in results if not r.passed} == {"include_usage", "tokenize"}


@pytest.mark.parametrize(
    ("broken", "check", "declares_n"),
    [
        ("n", "n_choices", False),
        ("n", "n_choices", True),
        ("context", "context_length_exceeded", False),
        ("done", "chat_stream", False),
        ("usage_sum", "chat_completion", False),
        ("leaks_lanes", "cancellation", False),
        ("refuses_after_hangup", "capacity", False),
    ],
)
def test_each_broken_clause_is_named(
    broken: str, check: str, declares_n: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sparkfold.conformance.SETTLE_S", 0.3)
    result = verdicts(broken, declares_n)
    assert result[check] is False
    assert sum(not ok for name, ok in result.items() if name not in ("include_usage", "tokenize")) >= 1


def test_unhealthy_server_stops_early() -> None:
    results = run("http://engine", transport=contract_double("health"))
    assert [(r.name, r.passed) for r in results] == [("health", False)]
