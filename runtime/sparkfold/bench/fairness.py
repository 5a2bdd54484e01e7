"""The ``fairness`` suite of ``sparkfold bench``: what the other lanes see while one long prompt is read.

Two phases with the same traffic: ``streams`` chat streams decode (each sends its next request as
soon as one ends) while short requests arrive every ``interval_s``. In the first phase nothing
else runs, for ``baseline_s``; in the second one long prompt (``long_tokens``, fresh text, one
reply token) is sent, and the phase lasts until its first token: its prefill. For each phase the
suite reports, over that window,

- the short requests' time to first token (p50 / p99; a short request counts when it was sent
  inside the window, its TTFT is its own however long it took);
- the decoding streams' inter-token gaps (between streamed deltas of one reply, on the client's
  clock): the longest and the p99 (a gap counts when it overlaps the window);

and the ratio of each figure with the long prompt to the same figure without it, the result.
The arithmetic (:func:`gaps`, :func:`figures`, :func:`ratios`) takes plain timestamps, so it is
tested on a fake clock; the traces are kept (seconds from the phase's start) for the plot.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from sparkfold.bench.client import Endpoint, Reply, stream_chat
from sparkfold.bench.prompts import KINDS, filler, messages, tokens_per_word

__all__ = ["Phase", "figures", "gaps", "percentile", "ratios", "run_fairness"]

SHORT_TOKENS = 4
"""Reply tokens of a short request: its TTFT is the figure, a few tokens end it quickly."""
BASELINE_SHARE = 0.4
"""Of the suite's deadline, the most the first window (streams starting included) may take: the
rest is the long prompt's."""
FIGURES = ("short_ttft_p50_s", "short_ttft_p99_s", "gap_max_s", "gap_p99_s")


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile by the nearest rank (``None`` without values)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def gaps(times: Sequence[float], start: float, end: float) -> list[float]:
    """The gaps between one reply's consecutive deltas (``times``, ascending) that overlap
    ``[start, end]``: a stream stalled across the window's edge stalled inside it too."""
    return [b - a for a, b in itertools.pairwise(times) if b > start and a < end]


@dataclass
class Phase:
    """What one phase saw, as timestamps of one clock: each stream reply's deltas, each short
    request's send time and first token (``None``: none came), the window measured."""

    start: float = 0.0
    end: float = 0.0
    replies: list[list[float]] = field(default_factory=list)
    shorts: list[tuple[float, float | None]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def trace(self) -> dict[str, Any]:
        """The phase's timestamps, in seconds from its window's start (ms precision), for plots."""

        def at(t: float) -> float:
            return round(t - self.start, 3)

        return {
            "window_s": at(self.end),
            "replies": [[at(t) for t in times] for times in self.replies if times],
            "shorts": [[at(sent), None if first is None else at(first)] for sent, first in self.shorts],
        }


def figures(phase: Phase) -> dict[str, Any]:
    """The phase's figures over its window: short TTFTs (p50, p99, how many) and stream gaps
    (longest, p99, how many)."""
    ttfts = [first - sent for sent, first in phase.shorts if phase.start <= sent <= phase.end and first]
    missing = sum(1 for sent, first in phase.shorts if phase.start <= sent <= phase.end and first is None)
    all_gaps = [gap for times in phase.replies for gap in gaps(times, phase.start, phase.end)]
    return {
        "window_s": phase.end - phase.start,
        "short_requests": len(ttfts),
        "short_failed": missing,
        "short_ttft_p50_s": percentile(ttfts, 0.5),
        "short_ttft_p99_s": percentile(ttfts, 0.99),
        "gaps": len(all_gaps),
        "gap_max_s": max(all_gaps) if all_gaps else None,
        "gap_p99_s": percentile(all_gaps, 0.99),
    }


def ratios(loaded: dict[str, Any], baseline: dict[str, Any]) -> dict[str, float | None]:
    """Each figure with the long prompt over the same figure without it (``None`` where either is
    missing or the baseline is 0)."""
    out: dict[str, float | None] = {}
    for name in FIGURES:
        a, b = loaded.get(name), baseline.get(name)
        out[name] = a / b if a is not None and b else None
    return out


Clock = Callable[[], float]


async def _stream_worker(
    client: httpx.AsyncClient, endpoint: Endpoint, max_tokens: int, lane: int, phase: Phase, clock: Clock
) -> None:
    """One decoding stream: a request after the other until cancelled, each reply's deltas timed."""
    index = 0
    while True:
        times: list[float] = []
        phase.replies.append(times)
        body = _body(endpoint, messages(next(iter(KINDS)), 1_000 * lane + index), max_tokens)
        reply = await stream_chat(client, body, on_delta=functools.partial(_stamp, times, clock))
        if not reply.ok:
            phase.errors.append(reply.error or "failed")
            await asyncio.sleep(0.2)  # a refused stream (no lane) tries again, bounded by the phase
        index += 1


def _stamp(times: list[float], clock: Clock) -> None:
    times.append(clock())


async def _short(
    client: httpx.AsyncClient, endpoint: Endpoint, index: int, phase: Phase, clock: Clock
) -> None:
    sent = clock()
    first: list[float] = []
    body = _body(endpoint, messages(next(iter(KINDS)), 500_000 + index), SHORT_TOKENS)
    reply = await stream_chat(client, body, on_first_token=lambda: first.append(clock()))
    phase.shorts.append((sent, first[0] if first and reply.ok else None))
    if not reply.ok:
        phase.errors.append(reply.error or "failed")


def _body(endpoint: Endpoint, msgs: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
    return {"model": endpoint.model, "messages": msgs, "max_tokens": max_tokens, "temperature": 0}


async def _phase(
    client: httpx.AsyncClient,
    endpoint: Endpoint,
    *,
    streams: int,
    interval_s: float,
    max_tokens: int,
    window: Callable[[], Any],
    deadline_s: float,
    clock: Clock = time.perf_counter,
) -> tuple[Phase, Any]:
    """Run the traffic; once every stream has streamed, ``window()`` (awaited) is the measured
    window. Returns the phase and what ``window()`` returned."""
    phase = Phase()
    workers = [
        asyncio.create_task(_stream_worker(client, endpoint, max_tokens, lane, phase, clock))
        for lane in range(streams)
    ]
    shorts: list[asyncio.Task[None]] = []
    stop = asyncio.Event()

    async def arrivals() -> None:
        index = 0
        while not stop.is_set():
            shorts.append(asyncio.create_task(_short(client, endpoint, index, phase, clock)))
            index += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval_s)

    give_up = clock() + deadline_s
    outcome: Any = None
    try:
        while sum(1 for times in phase.replies if times) < streams and clock() < give_up:
            await asyncio.sleep(0.02)  # every stream decoding before the window opens
        sender = asyncio.create_task(arrivals())
        phase.start = clock()
        try:
            outcome = await asyncio.wait_for(window(), max(1.0, give_up - clock()))
        except TimeoutError:
            phase.errors.append(f"the phase's {deadline_s:.0f} s deadline passed")
        phase.end = clock()
        stop.set()
        await sender
        if shorts:  # the last short requests still count: bounded by the deadline's remainder
            await asyncio.wait(shorts, timeout=max(1.0, give_up - clock()))
    finally:
        for task in [*workers, *shorts]:
            task.cancel()
        await asyncio.gather(*workers, *shorts, return_exceptions=True)
    return phase, outcome


async def run_fairness(
    client: httpx.AsyncClient,
    endpoint: Endpoint,
    *,
    window_tokens: int,
    long_tokens: int,
    streams: int,
    interval_s: float,
    baseline_s: float,
    max_tokens: int,
    max_seconds: float,
) -> dict[str, Any]:
    """Both phases and their figures; ``long_tokens`` is capped by ``window_tokens``."""
    started = time.perf_counter()
    per_word = await tokens_per_word(client, endpoint.model)
    long_tokens = max(64, min(long_tokens, window_tokens))
    text = filler(max(1, int(long_tokens / per_word)), seed=random.randrange(1 << 30)) + "\nSay OK."
    long_reply: list[Reply] = []

    async def baseline_window() -> None:
        await asyncio.sleep(baseline_s)

    async def long_window() -> Reply:
        body = _body(endpoint, [{"role": "user", "content": text}], 1)
        reply = await stream_chat(client, body)
        long_reply.append(reply)
        return reply

    def left() -> float:
        return max(1.0, max_seconds - (time.perf_counter() - started))

    traffic = functools.partial(
        _phase, client, endpoint, streams=streams, interval_s=interval_s, max_tokens=max_tokens
    )
    first_deadline = min(left() * BASELINE_SHARE, baseline_s * 4 + 60)
    baseline, _ = await traffic(window=baseline_window, deadline_s=first_deadline)
    loaded, _ = await traffic(window=long_window, deadline_s=left())
    before, during = figures(baseline), figures(loaded)
    reply = long_reply[0] if long_reply else Reply(False, error="the long prompt was not answered in time")
    errors = [*baseline.errors, *loaded.errors, *([] if reply.ok else [reply.error or "failed"])]
    return {
        "streams": streams,
        "interval_s": interval_s,
        "long_tokens": reply.prompt_tokens or long_tokens,
        "long_ttft_s": reply.ttft_s,
        "baseline": before,
        "loaded": during,
        "ratio": ratios(during, before),
        "traces": {"baseline": baseline.trace(), "loaded": loaded.trace()},
        "errors": len(errors),
        "error_samples": sorted(set(errors))[:3],
    }
