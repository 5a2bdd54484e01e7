"""The suites of ``sparkfold bench``: decode, prefill, reuse and exact, each bounded and counted.

- ``decode``: at each concurrency level, that many chat streams stay open until ``rounds × level``
  requests have finished, for prose and for structured prompts: aggregate tok/s (every streamed
  token / the level's wall time), per-request tok/s (median of each stream's rate after its first
  token), TTFT p50 / p90 (request sent to first token, client clock). Before each level's measured
  requests, ``warmup × level`` of the same shape run unmeasured (their errors still count): an
  engine's first requests of a new batch size or prompt kind pay one-time costs (kernel compiles,
  autotuning, allocations) that are not its speed.
- ``prefill``: one fresh prompt per length, from 8k tokens doubling up to the window: prompt
  tokens / TTFT. A length is started only while the last measured rate says it ends before the
  phase's deadline (the others are rows that say why they were skipped).
- ``reuse``: the same long prompt sent twice (first visit, then the re-send), and two new
  conversations sharing one long system prompt: TTFT of each, and the cached tokens reported.
- ``exact``: greedy replies sent one at a time, then all at once (burst), then each as the one
  before it starts streaming (staggered): how many concurrent replies equal their serial twin.
- ``fairness``: decoding streams and short requests at a fixed rate, without and then with one long
  prompt being read: the short requests' TTFT and the streams' longest gap, and their ratios
  (:mod:`sparkfold.bench.fairness`).

Every phase stops starting requests at its deadline (``max_seconds``); a request that fails is
an error in its phase's count, with up to three distinct messages kept, never dropped.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
from tqdm import tqdm  # type: ignore[import-untyped]

from sparkfold.bench.client import Endpoint, Reply, stream_chat
from sparkfold.bench.fairness import run_fairness
from sparkfold.bench.prompts import KINDS, filler, messages, tokens_per_word

__all__ = ["SUITES", "Knobs", "run_suite"]

SUITES = ("decode", "prefill", "reuse", "exact", "fairness")
PREFILL_FROM = 8_192
MARGIN_TOKENS = 256  # room left in the window for the template and the reply


@dataclass(frozen=True)
class Knobs:
    """What the suites send and how long they may take (see ``sparkfold bench --help``)."""

    levels: tuple[int, ...] = (1, 4, 8)
    rounds: int = 2
    warmup: int = 1  # unmeasured rounds before each decode level's measured ones
    max_tokens: int = 256
    prefill_lengths: tuple[int, ...] | None = None  # None: 8k doubling up to the window
    window: int | None = None  # None: the endpoint's max_model_len, else 32k
    reuse_tokens: int = 65_536
    system_tokens: int = 7_900
    exact_requests: int = 4
    exact_tokens: int = 64
    fairness_streams: int = 2
    fairness_interval_s: float = 0.5
    fairness_tokens: int | None = None  # None: the window, or what the phase's deadline allows
    fairness_baseline_s: float = 10.0
    max_seconds: float = 900.0
    progress: bool = field(default_factory=lambda: sys.stderr.isatty())
    budget_s: float = 0.0
    """> 0: size the knobs not in ``fixed`` by a first measured request to fit this (``plan``)."""
    fixed: frozenset[str] = frozenset()
    """Knobs the user set: a plan keeps them."""


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _errors(replies: list[Reply]) -> dict[str, Any]:
    failed = [r for r in replies if not r.ok]
    return {"errors": len(failed), "error_samples": sorted({r.error or "" for r in failed})[:3]}


def _bar(knobs: Knobs, total: int, desc: str) -> tqdm[Any]:
    return tqdm(total=total, desc=desc, unit="req", disable=not knobs.progress, leave=False, file=sys.stderr)


def _body(endpoint: Endpoint, msgs: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
    return {"model": endpoint.model, "messages": msgs, "max_tokens": max_tokens, "temperature": 0}


def _window(endpoint: Endpoint, knobs: Knobs) -> int:
    return knobs.window or endpoint.window or 32_768


# --- decode -----------------------------------------------------------------------------------


async def _streams(
    client: httpx.AsyncClient, endpoint: Endpoint, knobs: Knobs, kind: str, level: int, total: int, desc: str
) -> list[Reply]:
    """``total`` requests of ``kind`` over ``level`` open streams, stopping at the phase deadline."""
    replies: list[Reply] = []
    issued = 0
    deadline = time.perf_counter() + knobs.max_seconds
    with _bar(knobs, total, desc) as bar:

        async def worker() -> None:
            nonlocal issued
            while issued < total and time.perf_counter() < deadline:
                index = issued
                issued += 1
                body = _body(endpoint, messages(kind, index), knobs.max_tokens)
                replies.append(await stream_chat(client, body))
                bar.update()

        await asyncio.gather(*(worker() for _ in range(level)))
    return replies


async def _level(
    client: httpx.AsyncClient, endpoint: Endpoint, knobs: Knobs, kind: str, level: int
) -> dict[str, Any]:
    warmup = await _streams(
        client, endpoint, knobs, kind, level, level * knobs.warmup, f"warm-up {kind} ×{level}"
    )
    started = time.perf_counter()
    replies = await _streams(
        client, endpoint, knobs, kind, level, level * knobs.rounds, f"decode {kind} ×{level}"
    )
    wall = time.perf_counter() - started
    good = [r for r in replies if r.ok]
    rates = [rate for r in good if (rate := r.decode_tok_s) is not None]
    ttfts = [r.ttft_s * 1000 for r in good if r.ttft_s is not None]
    return {
        "concurrency": level,
        "requests": len(replies),
        "warmup_requests": len(warmup),
        "aggregate_tok_s": sum(r.tokens for r in good) / wall if wall > 0 else 0.0,
        "per_request_tok_s": statistics.median(rates) if rates else None,
        "ttft_p50_ms": _percentile(ttfts, 0.5),
        "ttft_p90_ms": _percentile(ttfts, 0.9),
        "completion_tokens_mean": statistics.mean(r.tokens for r in good) if good else None,
        "wall_s": wall,
        **_errors(warmup + replies),
    }


async def decode(client: httpx.AsyncClient, endpoint: Endpoint, knobs: Knobs) -> dict[str, Any]:
    levels = {kind: [await _level(client, endpoint, knobs, kind, n) for n in knobs.levels] for kind in KINDS}
    rows = [row for kind in levels.values() for row in kind]
    samples = sorted({sample for row in rows for sample in row["error_samples"]})[:3]
    return {"levels": levels, "errors": sum(row["errors"] for row in rows), "error_samples": samples}


# --- prefill ----------------------------------------------------------------------------------


def prefill_lengths(window: int, given: tuple[int, ...] | None) -> list[int]:
    """``given``, else 8k doubling while it fits the window (or three steps up to a small window)."""
    room = window - MARGIN_TOKENS
    if given:
        return list(given)
    lengths = []
    n = PREFILL_FROM
    while n <= room:
        lengths.append(n)
        n *= 2
    if lengths and room >= lengths[-1] * 1.5:
        lengths.append(room)  # the window itself, when the last doubling left much of it unused
    return lengths or [room // 4, room // 2, room]


def _past_deadline(target: int, rate_tok_s: float, left_s: float) -> str | None:
    """Why a ``target``-token prompt is not started with ``left_s`` to the deadline: none left, or
    its prefill at the last measured rate would end past it (``None``: start it)."""
    if left_s <= 0:
        return "time limit"
    if rate_tok_s and target / rate_tok_s > left_s:
        return f"time limit: ~{target / rate_tok_s:,.0f} s at {rate_tok_s:,.0f} tok/s, {left_s:,.0f} s left"
    return None


async def _long(
    client: httpx.AsyncClient, endpoint: Endpoint, tokens: int, per_word: float, seed: int
) -> tuple[str, Reply]:
    text = filler(max(1, int(tokens / per_word)), seed)
    body = _body(endpoint, [{"role": "user", "content": text + "\nSay OK."}], 1)
    return text, await stream_chat(client, body)


async def prefill(client: httpx.AsyncClient, endpoint: Endpoint, knobs: Knobs) -> dict[str, Any]:
    window = _window(endpoint, knobs)
    lengths = prefill_lengths(window, knobs.prefill_lengths)
    per_word = await tokens_per_word(client, endpoint.model)
    rows: list[dict[str, Any]] = []
    replies: list[Reply] = []
    deadline = time.perf_counter() + knobs.max_seconds
    rate = 0.0  # the last measured length's tok/s
    with _bar(knobs, len(lengths), "prefill") as bar:
        for seed, target in enumerate(lengths):
            skipped = _past_deadline(target, rate, deadline - time.perf_counter())
            if target > window - MARGIN_TOKENS:
                skipped = f"does not fit the {window:,}-token window"
            if skipped:
                rows.append({"target_tokens": target, "skipped": skipped})
                bar.update()
                continue
            _, reply = await _long(client, endpoint, target, per_word, seed)
            replies.append(reply)
            row: dict[str, Any] = {"target_tokens": target, "prompt_tokens": reply.prompt_tokens}
            if reply.ok and reply.ttft_s:
                rate = (reply.prompt_tokens or target) / reply.ttft_s
                row |= {"ttft_s": reply.ttft_s, "tok_s": rate, "cached_tokens": reply.cached_tokens}
            else:
                row["error"] = reply.error
            rows.append(row)
            bar.update()
    return {"window": window, "tokens_per_word": per_word, "rows": rows, **_errors(replies)}


# --- reuse ------------------------------------------------------------------------------------


def _visit(name: str, first: Reply, second: Reply) -> dict[str, Any]:
    row: dict[str, Any] = {"prompt": name, "prompt_tokens": first.prompt_tokens}
    if first.ok and second.ok:
        row |= {"first_s": first.ttft_s, "next_s": second.ttft_s, "cached_tokens": second.cached_tokens}
    else:
        row["error"] = first.error or second.error
    return row


async def reuse(client: httpx.AsyncClient, endpoint: Endpoint, knobs: Knobs) -> dict[str, Any]:
    window = _window(endpoint, knobs)
    per_word = await tokens_per_word(client, endpoint.model)
    long_tokens = min(knobs.reuse_tokens, window - MARGIN_TOKENS)
    system_tokens = min(knobs.system_tokens, (window - MARGIN_TOKENS) // 2)
    replies: list[Reply] = []
    with _bar(knobs, 4, "reuse") as bar:

        async def send(msgs: list[dict[str, str]]) -> Reply:
            reply = await stream_chat(client, _body(endpoint, msgs, 8))
            replies.append(reply)
            bar.update()
            return reply

        text = filler(max(1, int(long_tokens / per_word)), seed=11) + "\nSay OK."
        prompt = [{"role": "user", "content": text}]
        resent = _visit(
            f"identical {long_tokens:,}-token prompt resent", await send(prompt), await send(prompt)
        )
        system = {"role": "system", "content": filler(max(1, int(system_tokens / per_word)), seed=12)}
        first = await send([system, {"role": "user", "content": "Name three rivers."}])
        second = await send([system, {"role": "user", "content": "Name three mountains."}])
        shared = _visit(f"new conversation, same {system_tokens:,}-token system prompt", first, second)
    return {"rows": [resent, shared], **_errors(replies)}


# --- exact ------------------------------------------------------------------------------------


def _diverges(a: Reply, b: Reply) -> int | None:
    """The first character where the two replies differ (reasoning, then text), or None."""
    left, right = a.reasoning + "\x00" + a.text, b.reasoning + "\x00" + b.text
    if left == right:
        return None
    return next(
        (i for i, (x, y) in enumerate(zip(left, right, strict=False)) if x != y), min(len(left), len(right))
    )


async def exact(client: httpx.AsyncClient, endpoint: Endpoint, knobs: Knobs) -> dict[str, Any]:
    n = knobs.exact_requests
    kinds = list(KINDS)
    bodies = [
        _body(endpoint, messages(kinds[i % 2], i // 2), knobs.exact_tokens) | {"seed": 0} for i in range(n)
    ]
    with _bar(knobs, 3 * n, "exact") as bar:

        async def one(body: dict[str, Any]) -> Reply:
            reply = await stream_chat(client, body)
            bar.update()
            return reply

        serial = [await one(body) for body in bodies]
        burst = await asyncio.gather(*(one(body) for body in bodies))
        staggered = await _staggered(client, bodies, bar.update)
    result: dict[str, Any] = {"requests": n, "max_tokens": knobs.exact_tokens, "mismatches": []}
    for mode, replies in (("burst", burst), ("staggered", staggered)):
        pairs = [(i, s, c) for i, (s, c) in enumerate(zip(serial, replies, strict=True)) if s.ok and c.ok]
        same = 0
        for i, s, c in pairs:
            at = _diverges(s, c)
            if at is None:
                same += 1
            else:
                result["mismatches"].append({"mode": mode, "request": i, "at_char": at})
        result[mode] = {"same": same, "compared": len(pairs)}
    return result | _errors([*serial, *burst, *staggered])


async def _staggered(
    client: httpx.AsyncClient, bodies: list[dict[str, Any]], done: Callable[[], object]
) -> list[Reply]:
    """Each request sent once the one before it has streamed its first token (or failed)."""
    tasks: list[asyncio.Task[Reply]] = []
    for body in bodies:
        streaming = asyncio.Event()
        tasks.append(asyncio.create_task(_watched(client, body, streaming)))
        waiter = asyncio.create_task(streaming.wait())
        await asyncio.wait({tasks[-1], waiter}, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
    replies = list(await asyncio.gather(*tasks))
    for _ in replies:
        done()
    return replies


async def _watched(client: httpx.AsyncClient, body: dict[str, Any], streaming: asyncio.Event) -> Reply:
    return await stream_chat(client, body, on_first_token=streaming.set)


# --- fairness ---------------------------------------------------------------------------------

FAIRNESS_PREFILL_SHARE = 0.25
"""Of the phase's deadline, what the long prompt's prefill may take at the probe's rate (a lower
bound: the rate grows with the prompt on a GPU, and the streams compete for it)."""


async def fairness(client: httpx.AsyncClient, endpoint: Endpoint, knobs: Knobs) -> dict[str, Any]:
    window = _window(endpoint, knobs)
    room = window - MARGIN_TOKENS - knobs.max_tokens
    long_tokens = knobs.fairness_tokens or room
    probe_tok_s = None
    if knobs.fairness_tokens is None:  # the window, unless its prefill at the probe's rate is too long
        per_word = await tokens_per_word(client, endpoint.model)
        _, probe = await _long(client, endpoint, min(1_024, room), per_word, seed=97)
        if probe.ok and probe.ttft_s and probe.prompt_tokens:
            probe_tok_s = probe.prompt_tokens / probe.ttft_s
            long_tokens = min(room, int(probe_tok_s * knobs.max_seconds * FAIRNESS_PREFILL_SHARE))
    result = await run_fairness(
        client,
        endpoint,
        window_tokens=room,
        long_tokens=long_tokens,
        streams=knobs.fairness_streams,
        interval_s=knobs.fairness_interval_s,
        baseline_s=knobs.fairness_baseline_s,
        max_tokens=knobs.max_tokens,
        max_seconds=knobs.max_seconds,
    )
    return result | {"probe_tok_s": probe_tok_s, "window": window}


# --- dispatch ---------------------------------------------------------------------------------

_RUNNERS: dict[str, Callable[[httpx.AsyncClient, Endpoint, Knobs], Awaitable[dict[str, Any]]]] = {
    "decode": decode,
    "prefill": prefill,
    "reuse": reuse,
    "exact": exact,
    "fairness": fairness,
}


async def run_suite(name: str, client: httpx.AsyncClient, endpoint: Endpoint, knobs: Knobs) -> dict[str, Any]:
    return await _RUNNERS[name](client, endpoint, knobs)
