"""One streamed chat request as a client sees it, against any OpenAI-compatible endpoint.

The gateway, an engine server and the fleet router all speak ``/v1/chat/completions`` with SSE;
this module sends one request and times it on the client's clock: time to the first streamed
token (content or reasoning), the decode time after it, the token count (the ``usage`` block when
the server sends one with ``stream_options.include_usage``, else one per delta), the reply's text
and reasoning kept apart, the prompt's cached tokens when reported, and the drafted and accepted
tokens of the engine's stats block (``tensorfold``) when it sends one. A refusal, a broken
stream or an error event is an :class:`Reply` with ``ok=False`` and the reason, never an
exception, so a suite counts it.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

__all__ = [
    "PROMPT_ROOM",
    "Endpoint",
    "Reply",
    "open_client",
    "reply_budget",
    "resolve_endpoint",
    "stream_chat",
]

PROMPT_ROOM = 1_024
"""Tokens a capped reply budget leaves for the prompt (a HumanEval problem in a chat template)."""


@dataclass(frozen=True)
class Reply:
    ok: bool
    ttft_s: float | None = None
    tokens: int = 0
    decode_s: float = 0.0
    wall_s: float = 0.0
    text: str = ""
    reasoning: str = ""
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    finish_reason: str | None = None
    error: str | None = None
    drafted: int | None = None  # the engine's stats block (``tensorfold``), when it sends one
    accepted: int | None = None

    @property
    def decode_tok_s(self) -> float | None:
        """This stream's own rate after its first token (``None`` for fewer than two tokens)."""
        if self.tokens > 1 and self.decode_s > 0:
            return (self.tokens - 1) / self.decode_s
        return None


@dataclass(frozen=True)
class Endpoint:
    """Where to send requests: the base URL, the bearer key, the model id and its window."""

    url: str
    model: str
    api_key: str | None = None
    window: int | None = None  # max_model_len from /v1/models, when listed


def reply_budget(what: str, model: str, window: int | None, requested: int) -> int:
    """``requested``, capped so a prompt of up to :data:`PROMPT_ROOM` tokens still fits ``window``
    (an endpoint refuses prompt + ``max_tokens`` past it with a 400), saying so on stderr."""
    if window is None or requested + PROMPT_ROOM <= window:
        return requested
    budget = max(window - PROMPT_ROOM, 16)
    print(
        f"{what}: max_tokens {requested} does not fit {model}'s {window}-token window: replies capped "
        f"at {budget} tokens (the window less {PROMPT_ROOM} for the prompt)",
        file=sys.stderr,
    )
    return budget


def open_client(endpoint_url: str, api_key: str | None, timeout_s: float, streams: int) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return httpx.AsyncClient(
        base_url=endpoint_url.rstrip("/"),
        headers=headers,
        limits=httpx.Limits(max_connections=streams + 4, max_keepalive_connections=streams + 4),
        timeout=httpx.Timeout(timeout_s, connect=10),
        trust_env=False,
    )


async def resolve_endpoint(
    client: httpx.AsyncClient, url: str, model: str | None, api_key: str | None
) -> Endpoint:
    """The served model (``model``, else the first listed) and its window, from ``/v1/models``."""
    listed = (await client.get("/v1/models")).raise_for_status().json()
    cards = listed.get("data") or []
    card = next((c for c in cards if model is None or c.get("id") == model), None)
    if card is None:
        names = ", ".join(str(c.get("id")) for c in cards) or "none"
        raise LookupError(f"model {model!r} is not served at {url} (listed: {names})")
    window = card.get("max_model_len")
    return Endpoint(url, str(card["id"]), api_key, int(window) if window else None)


def _failed(started: float, error: str) -> Reply:
    return Reply(False, wall_s=time.perf_counter() - started, error=error)


async def stream_chat(
    client: httpx.AsyncClient,
    body: dict[str, Any],
    on_first_token: Callable[[], object] | None = None,
    on_delta: Callable[[], object] | None = None,
) -> Reply:
    """Send ``body`` (``stream`` and ``include_usage`` are set here) and read the stream to its end;
    ``on_first_token`` is called as the first token arrives, ``on_delta`` as each token delta does."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    started = time.perf_counter()
    first: float | None = None
    deltas = 0
    text: list[str] = []
    reasoning: list[str] = []
    usage: dict[str, Any] = {}
    stats: dict[str, Any] = {}
    finish: str | None = None
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                detail = (await response.aread()).decode(errors="replace")
                return _failed(started, f"HTTP {response.status_code}: {detail[:200]}")
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    error = chunk["error"]
                    return _failed(
                        started, str(error.get("message", error) if isinstance(error, dict) else error)
                    )
                usage = chunk.get("usage") or usage
                stats = chunk.get("tensorfold") or stats
                for choice in chunk.get("choices") or []:
                    delta = choice.get("delta") or {}
                    finish = choice.get("finish_reason") or finish
                    piece, thought = delta.get("content"), delta.get("reasoning_content")
                    if piece or thought:
                        deltas += 1
                        if on_delta is not None:
                            on_delta()
                        if first is None:
                            first = time.perf_counter()
                            if on_first_token is not None:
                                on_first_token()
                        text.append(piece or "")
                        reasoning.append(thought or "")
    except (httpx.HTTPError, ValueError) as exc:
        return _failed(started, f"{type(exc).__name__}: {exc}")
    end = time.perf_counter()
    if first is None:
        return _failed(started, f"no tokens streamed (finish_reason {finish})")
    details = usage.get("prompt_tokens_details") or {}
    return Reply(
        True,
        ttft_s=first - started,
        tokens=int(usage.get("completion_tokens") or deltas),
        decode_s=end - first,
        wall_s=end - started,
        text="".join(text),
        reasoning="".join(reasoning),
        prompt_tokens=usage.get("prompt_tokens"),
        cached_tokens=details.get("cached_tokens"),
        finish_reason=finish,
        drafted=_count(stats.get("drafted")),
        accepted=_count(stats.get("accepted")),
    )


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
