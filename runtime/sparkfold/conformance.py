"""The engine protocol conformance suite: does a server keep the contract the gateway relies on?

``run(base_url)`` sends a fixed sequence of small requests to an engine server (ours, or a real
TensorFold rank 0) and returns one :class:`CheckResult` per clause of ``docs/engine-protocol.md``.
Required checks are what the gateway cannot work without; optional ones are later TensorFold
additions our engines have (``include_usage``, vLLM ``/tokenize`` fields) and are reported, not failed.
Every request is small (a handful of reply tokens) so the suite is cheap on a real pair too.

Two checks hold every engine to what the gateway's admission relies on (it is the one admission
authority; the engine follows): ``cancellation`` (a client that hangs up, streamed or not, frees
its lane: ``requests_running`` falls back within :data:`SETTLE_S`) and ``capacity`` (with every
lane busy, a client that leaves hands its lane to the next request at once: no 503, no error
event). Their streams ask for up to :data:`HOLD_TOKENS` tokens and are closed after one event.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

__all__ = ["CheckResult", "ConformanceFailure", "run"]

PROMPT = [{"role": "user", "content": "Say hello."}]
REPLY_TOKENS = 8
HOLD_TOKENS = 256
"""Reply budget of the streams that hold a lane in the capacity and cancellation checks."""
SETTLE_S = 10.0
"""How long a freed lane may take to show in ``/health`` (``requests_running``)."""


class ConformanceFailure(AssertionError):
    """A clause of the contract that the server did not keep; the message says which and how."""


@dataclass(frozen=True)
class CheckResult:
    name: str
    passed: bool
    detail: str
    required: bool = True


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ConformanceFailure(message)


def _json(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        raise ConformanceFailure(f"body is not JSON: {response.text[:120]!r}") from None
    _require(isinstance(body, dict), f"body is not a JSON object: {body!r:.120}")
    return body  # type: ignore[no-any-return]


def _error_body(response: httpx.Response, status: int) -> dict[str, Any]:
    _require(response.status_code == status, f"expected HTTP {status}, got {response.status_code}")
    error = _json(response).get("error")
    _require(isinstance(error, dict) and bool(error.get("message")), "no error.message in the body")
    return error  # type: ignore[return-value]


def _check_usage(usage: Any) -> None:
    _require(isinstance(usage, dict), f"usage missing: {usage!r}")
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        _require(isinstance(usage.get(key), int), f"usage.{key} is not an integer")
    _require(
        usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"],
        "usage.total_tokens != prompt_tokens + completion_tokens",
    )


class _Suite:
    def __init__(self, client: httpx.Client, model: str | None) -> None:
        self.client = client
        self.model = model or ""
        self.context = 0
        self.serves_n = False

    def chat(self, **fields: Any) -> httpx.Response:
        body = {
            "model": self.model,
            "messages": PROMPT,
            "max_tokens": REPLY_TOKENS,
            "temperature": 0,
            **fields,
        }
        return self.client.post("/v1/chat/completions", json=body)

    def stream_events(self, **fields: Any) -> list[str]:
        body = {"model": self.model, "messages": PROMPT, "max_tokens": REPLY_TOKENS, "temperature": 0}
        body |= {"stream": True, **fields}
        with self.client.stream("POST", "/v1/chat/completions", json=body) as response:
            _require(response.status_code == 200, f"HTTP {response.status_code}")
            kind = response.headers.get("content-type", "")
            _require(kind.startswith("text/event-stream"), f"content-type is {kind!r}")
            return [line[5:].strip() for line in response.iter_lines() if line.startswith("data:")]

    # --- the checks, in the order they run ---------------------------------------------------

    def health(self) -> str:
        body = _json(self.client.get("/health"))
        _require(body.get("ok") is True, f'"ok" is not true: {body.get("ok")!r}')
        for key in ("requests_total", "prompt_tokens_total", "completion_tokens_total"):
            _require(isinstance(body.get(key), int), f"/health lacks the counter {key}")
        self.context = int(body.get("context_length") or 0)
        return f"ok, context_length {self.context}"

    def models(self) -> str:
        body = _json(self.client.get("/v1/models"))
        ids = [m.get("id") for m in body.get("data", []) if isinstance(m, dict)]
        _require(body.get("object") == "list" and bool(ids), "no models listed")
        if not self.model:
            self.model = str(ids[0])
        _require(self.model in ids, f"{self.model!r} is not among {ids}")
        card = next(m for m in body["data"] if isinstance(m, dict) and m.get("id") == self.model)
        capabilities = card.get("capabilities")
        self.serves_n = isinstance(capabilities, dict) and capabilities.get("n") is True
        return f"serves {', '.join(map(str, ids))}"

    def chat_completion(self) -> str:
        response = self.chat()
        _require(response.status_code == 200, f"HTTP {response.status_code}: {response.text[:200]}")
        body = _json(response)
        _require(body.get("object") == "chat.completion", f"object is {body.get('object')!r}")
        choice = body["choices"][0]
        _require(choice["message"].get("role") == "assistant", "message.role is not assistant")
        _require(isinstance(choice["message"].get("content"), str), "message.content is not a string")
        _require(
            choice.get("finish_reason") in ("stop", "length"),
            f"finish_reason {choice.get('finish_reason')!r}",
        )
        _check_usage(body.get("usage"))
        _require(body["usage"]["completion_tokens"] <= REPLY_TOKENS, "max_tokens not respected")
        return f"{body['usage']['completion_tokens']} tokens, finish {choice['finish_reason']}"

    def chat_stream(self) -> str:
        events = self.stream_events()
        _require(bool(events) and events[-1] == "[DONE]", "stream does not end with data: [DONE]")
        chunks = [json.loads(e) for e in events[:-1]]
        _require(bool(chunks), "no chunks before [DONE]")
        _require(
            all(c.get("object") == "chat.completion.chunk" for c in chunks), "a chunk is not a chunk object"
        )
        _require(
            chunks[0]["choices"][0]["delta"].get("role") == "assistant", "first delta lacks role assistant"
        )
        finals = [c for c in chunks if c.get("choices") and c["choices"][0].get("finish_reason")]
        _require(len(finals) == 1, f"{len(finals)} chunks carry a finish_reason (want exactly 1)")
        usage = next((c["usage"] for c in reversed(chunks) if c.get("usage")), None)
        _check_usage(usage)
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices"))
        return f"{len(chunks)} chunks, {len(text)} chars"

    def greedy_is_repeatable(self) -> str:
        first, second = (_json(self.chat())["choices"][0]["message"]["content"] for _ in range(2))
        _require(first == second, f"two greedy replies differ: {first!r} vs {second!r}")
        return "identical"

    def stream_equals_plain(self) -> str:
        plain = _json(self.chat())["choices"][0]["message"]["content"]
        chunks = [json.loads(e) for e in self.stream_events()[:-1]]
        streamed = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices"))
        _require(plain == streamed, f"streamed text {streamed!r} differs from plain {plain!r}")
        return "identical"

    def completions(self) -> str:
        body = {"model": self.model, "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}
        response = self.client.post("/v1/completions", json=body)
        _require(response.status_code == 200, f"HTTP {response.status_code}: {response.text[:200]}")
        data = _json(response)
        _require(data.get("object") == "text_completion", f"object is {data.get('object')!r}")
        _require(isinstance(data["choices"][0].get("text"), str), "choices[0].text is not a string")
        _check_usage(data.get("usage"))
        return repr(data["choices"][0]["text"])

    def context_length_exceeded(self) -> str:
        _require(self.context > 0, "/health gave no context_length to test against")
        error = _error_body(self.chat(max_tokens=self.context + 1), 400)
        _require(error.get("code") == "context_length_exceeded", f"error.code is {error.get('code')!r}")
        return error["message"][:80]

    def malformed_json(self) -> str:
        response = self.client.post(
            "/v1/chat/completions", content=b'{"messages": [', headers={"content-type": "application/json"}
        )
        return _error_body(response, 400)["message"][:80]

    def wrong_type(self) -> str:
        response = self.client.post("/v1/chat/completions", json={"model": self.model, "messages": "hello"})
        return _error_body(response, 400)["message"][:80]

    def n_choices(self) -> str:
        """``n = 2``: two choices where the model card declares ``capabilities.n``, else a 400."""
        if not self.serves_n:
            return _error_body(self.chat(n=2), 400)["message"][:80]
        response = self.chat(n=2)
        _require(response.status_code == 200, f"capabilities.n is declared, yet HTTP {response.status_code}")
        indexes = sorted(c.get("index") for c in _json(response).get("choices", []))
        _require(indexes == [0, 1], f"n = 2 gave choices with indexes {indexes} (want [0, 1])")
        return "two choices (capabilities.n)"

    def unknown_path(self) -> str:
        _require(self.client.get("/v1/no-such-route").status_code == 404, "unknown path is not a 404")
        return "404"

    def still_serving(self) -> str:
        _require(self.chat().status_code == 200, "a valid request failed after the bad ones")
        return "ok after bad input"

    def _running(self) -> int:
        value = _json(self.client.get("/health")).get("requests_running")
        if not isinstance(value, int):
            raise ConformanceFailure("/health lacks requests_running")
        return value

    def _settled(self, baseline: int) -> float:
        """Seconds until ``requests_running`` is back at ``baseline`` (a failure past SETTLE_S)."""
        started = time.monotonic()
        while (running := self._running()) > baseline:
            waited = time.monotonic() - started
            _require(
                waited < SETTLE_S, f"{running - baseline} lane(s) still busy {SETTLE_S:g} s after the hang-up"
            )
            time.sleep(0.05)
        return time.monotonic() - started

    def _held(self) -> dict[str, Any]:
        budget = min(HOLD_TOKENS, max(self.context // 2, 1)) if self.context else HOLD_TOKENS
        return {
            "model": self.model,
            "messages": PROMPT,
            "max_tokens": budget,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
        }

    def cancellation(self) -> str:
        baseline = self._running()
        with self.client.stream("POST", "/v1/chat/completions", json=self._held()) as response:
            _require(response.status_code == 200, f"HTTP {response.status_code}")
            next(response.iter_lines())  # one event, then the client hangs up
        streamed = self._settled(baseline)
        body = {**self._held(), "stream": False}
        with contextlib.suppress(httpx.ReadTimeout):  # a non-streamed request whose client gives up
            self.client.post("/v1/chat/completions", json=body, timeout=httpx.Timeout(30, read=0.2))
        plain = self._settled(baseline)
        return f"lane free {streamed:.1f} s after a streamed hang-up, {plain:.1f} s after a plain one"

    def capacity(self) -> str:
        reported = _json(self.client.get("/health")).get("streams")
        lanes = reported if isinstance(reported, int) and reported > 0 else 1  # a dict: states, not lanes
        with contextlib.ExitStack() as held:
            streams = []
            for _ in range(lanes):
                response = held.enter_context(
                    self.client.stream("POST", "/v1/chat/completions", json=self._held())
                )
                _require(response.status_code == 200, f"holding {lanes} lanes: HTTP {response.status_code}")
                lines = response.iter_lines()
                next(lines)
                streams.append(response)
            streams[0].close()  # its client leaves; the next request comes at once
            events = self.stream_events()
        _require(bool(events) and events[-1] == "[DONE]", "the request after the hang-up did not finish")
        errors = [e for e in events[:-1] if '"error"' in e]
        _require(not errors, f"the request after the hang-up failed: {errors[0][:160] if errors else ''}")
        return f"{lanes} lane(s) busy, one freed by a hang-up and taken at once"

    def metrics(self) -> str:
        response = self.client.get("/metrics")
        _require(response.status_code == 200, f"HTTP {response.status_code}")
        types = [line for line in response.text.splitlines() if line.startswith("# TYPE")]
        _require(bool(types), "no Prometheus # TYPE lines")
        return f"{len(types)} metric families"

    def include_usage(self) -> str:
        chunks = [json.loads(e) for e in self.stream_events(stream_options={"include_usage": True})[:-1]]
        usage_only = [c for c in chunks if c.get("usage") and not c.get("choices")]
        _require(len(usage_only) == 1, "no separate usage chunk with empty choices")
        return "separate usage chunk"

    def tokenize(self) -> str:
        response = self.client.post("/tokenize", json={"model": self.model, "prompt": "hello world"})
        data = _json(response)
        tokens = data.get("tokens")
        if not isinstance(tokens, list) or data.get("count") != len(tokens):
            raise ConformanceFailure("tokens/count missing")
        back = _json(self.client.post("/detokenize", json={"model": self.model, "tokens": tokens}))
        _require("hello world" in str(back.get("prompt")), f"detokenize gave {back.get('prompt')!r}")
        return f"{len(tokens)} tokens, round trip ok"

    def checks(self) -> list[tuple[Callable[[], str], bool]]:
        required = [
            self.health,
            self.models,
            self.chat_completion,
            self.chat_stream,
            self.greedy_is_repeatable,
            self.stream_equals_plain,
            self.completions,
            self.context_length_exceeded,
            self.malformed_json,
            self.wrong_type,
            self.n_choices,
            self.unknown_path,
            self.still_serving,
            self.metrics,
            self.cancellation,
            self.capacity,
        ]
        optional = [self.include_usage, self.tokenize]
        return [(c, True) for c in required] + [(c, False) for c in optional]


def run(
    base_url: str,
    model: str | None = None,
    timeout_s: float = 120.0,
    transport: httpx.BaseTransport | None = None,
) -> list[CheckResult]:
    """Run every check against the engine server at ``base_url``; never raises for a server's fault."""
    results: list[CheckResult] = []
    with httpx.Client(base_url=base_url.rstrip("/"), timeout=timeout_s, transport=transport) as client:
        suite = _Suite(client, model)
        for check, required in suite.checks():
            name = check.__name__
            try:
                results.append(CheckResult(name, True, check(), required))
            except (ConformanceFailure, httpx.HTTPError, KeyError, IndexError, TypeError, ValueError) as exc:
                detail = str(exc) or type(exc).__name__
                results.append(CheckResult(name, False, detail, required))
                if name in ("health", "models"):
                    break  # nothing else can be meaningful
    return results
