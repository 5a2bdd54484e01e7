"""``sparkfold bench URL``: a bounded streaming load against any OpenAI-compatible server.

For each concurrency level it keeps that many chat streams open at once until ``requests`` have
finished (or ``max_seconds`` passed), and reports per level: time to first token (median and p90),
each stream's decode rate, the aggregate streamed tokens per second, and errors. Point it at the
gateway (with ``--api-key``) or straight at an engine server to compare the two in one sitting.
Tokens are counted as content/reasoning deltas (one delta per token on our engines and TensorFold).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

__all__ = ["LevelResult", "StreamResult", "run_load"]

DEFAULT_PROMPT = "Write a short story about a lighthouse keeper."


@dataclass(frozen=True)
class StreamResult:
    ok: bool
    ttft_s: float | None = None
    tokens: int = 0
    decode_s: float = 0.0
    error: str | None = None


@dataclass
class LevelResult:
    concurrency: int
    requests: int
    errors: int
    ttft_p50_ms: float | None
    ttft_p90_ms: float | None
    stream_tok_s_p50: float | None
    aggregate_tok_s: float
    wall_s: float
    error_samples: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def _one_stream(client: httpx.AsyncClient, body: dict[str, Any]) -> StreamResult:
    sent = time.perf_counter()
    first: float | None = None
    tokens = 0
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                return StreamResult(False, error=f"HTTP {response.status_code}: {text[:200]}")
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    return StreamResult(False, error=str(chunk["error"].get("message", chunk["error"])))
                for choice in chunk.get("choices") or []:
                    delta = choice.get("delta") or {}
                    if delta.get("content") or delta.get("reasoning_content"):
                        tokens += 1
                        first = first if first is not None else time.perf_counter()
    except (httpx.HTTPError, ValueError) as exc:
        return StreamResult(False, error=f"{type(exc).__name__}: {exc}")
    end = time.perf_counter()
    if first is None:
        return StreamResult(False, error="no tokens streamed")
    return StreamResult(True, ttft_s=first - sent, tokens=tokens, decode_s=end - first)


async def _level(
    client: httpx.AsyncClient, body: dict[str, Any], concurrency: int, requests: int, max_seconds: float
) -> LevelResult:
    results: list[StreamResult] = []
    remaining = requests
    deadline = time.perf_counter() + max_seconds
    start = time.perf_counter()

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0 and time.perf_counter() < deadline:
            remaining -= 1
            results.append(await _one_stream(client, body))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - start
    good = [r for r in results if r.ok]
    rates = [(r.tokens - 1) / r.decode_s for r in good if r.tokens > 1 and r.decode_s > 0]
    ttfts = [r.ttft_s * 1000 for r in good if r.ttft_s is not None]
    return LevelResult(
        concurrency=concurrency,
        requests=len(results),
        errors=len(results) - len(good),
        ttft_p50_ms=_percentile(ttfts, 0.5),
        ttft_p90_ms=_percentile(ttfts, 0.9),
        stream_tok_s_p50=statistics.median(rates) if rates else None,
        aggregate_tok_s=sum(r.tokens for r in good) / wall if wall > 0 else 0.0,
        wall_s=wall,
        error_samples=sorted({r.error for r in results if r.error})[:3],
    )


async def _run(
    url: str,
    *,
    concurrency: list[int],
    requests: int,
    max_tokens: int,
    model: str | None,
    api_key: str | None,
    prompt: str,
    max_seconds: float,
) -> list[LevelResult]:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=max(concurrency) + 4)
    timeout = httpx.Timeout(max_seconds, connect=10)
    async with httpx.AsyncClient(
        base_url=url.rstrip("/"), headers=headers, limits=limits, timeout=timeout, trust_env=False
    ) as client:
        if model is None:
            listed = (await client.get("/v1/models")).raise_for_status().json()
            model = str(listed["data"][0]["id"])
        body = {
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
        }
        return [await _level(client, body, level, max(requests, level), max_seconds) for level in concurrency]


def run_load(
    url: str,
    *,
    concurrency: list[int],
    requests: int = 8,
    max_tokens: int = 64,
    model: str | None = None,
    api_key: str | None = None,
    prompt: str = DEFAULT_PROMPT,
    max_seconds: float = 300.0,
) -> list[LevelResult]:
    """One :class:`LevelResult` per concurrency level; each level stops after ``max_seconds``."""
    return asyncio.run(
        _run(
            url,
            concurrency=concurrency,
            requests=requests,
            max_tokens=max_tokens,
            model=model,
            api_key=api_key,
            prompt=prompt,
            max_seconds=max_seconds,
        )
    )
