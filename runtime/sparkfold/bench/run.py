"""One ``sparkfold bench`` run: resolve the endpoint, run the chosen suites in order, keep it all.

The result is one JSON-ready dict (``FORMAT`` names its shape) holding the endpoint, the knobs,
each suite's numbers and error count, and the time each suite took; ``report`` turns it into the
recipe's tables and ``plots`` into pictures, so a saved run can be drawn again or compared later.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from datetime import UTC, datetime
from typing import Any

import httpx

from sparkfold.bench.client import Endpoint, open_client, resolve_endpoint, stream_chat
from sparkfold.bench.plan import PHASE_SHARES, Plan, Prompts, long_prompts, plan
from sparkfold.bench.prompts import KINDS, filler, messages
from sparkfold.bench.suites import Knobs, prefill_lengths, run_suite

__all__ = ["FORMAT", "run", "total_errors"]

FORMAT = "sparkfold-bench/1"


OnSuite = Callable[[dict[str, Any]], None]
OnNote = Callable[[str], None]
SIZED = {
    "decode": {"levels", "rounds", "warmup", "max_tokens"},
    "exact": {"exact_tokens"},
    "prefill": {"prefill_lengths"},
    "reuse": {"reuse_tokens", "system_tokens"},
}
"""The knobs a plan sizes, by the suite that uses them: no probe when all are set."""


async def _run(
    url: str,
    suites: list[str],
    knobs: Knobs,
    api_key: str | None,
    model: str | None,
    on_suite: OnSuite,
    say: OnNote,
) -> dict[str, Any]:
    streams = max(*knobs.levels, knobs.exact_requests, knobs.fairness_streams + 8)  # + shorts, the long
    async with open_client(url, api_key, knobs.max_seconds, streams) as client:
        endpoint = await resolve_endpoint(client, url, model, api_key)
        result: dict[str, Any] = {
            "format": FORMAT,
            "url": url,
            "model": endpoint.model,
            "window": endpoint.window,
            "started": datetime.now(UTC).isoformat(timespec="seconds"),
            "knobs": _knobs(knobs),
            "suites": {},
        }
        if knobs.budget_s > 0 and any(SIZED.get(name, set()) - knobs.fixed for name in suites):
            knobs, result["plan"] = await _sized(client, endpoint, knobs, suites, say)
            result["knobs"] = _knobs(knobs)
        expected = _expected(knobs, result.get("plan"), suites)
        for n, name in enumerate(suites):
            started = time.perf_counter()
            phase = replace(knobs, max_seconds=_phase_seconds(knobs, name))
            suite = await run_suite(name, client, endpoint, phase)
            result["suites"][name] = suite | {"seconds": round(time.perf_counter() - started, 2)}
            on_suite(result)
            left = sum(expected[later] for later in suites[n + 1 :])
            say(
                f"{name}: {time.perf_counter() - started:.0f} s"
                + (f"; about {left:.0f} s left" if left else "")
            )
    return result


def _knobs(knobs: Knobs) -> dict[str, Any]:
    return asdict(knobs) | {"fixed": sorted(knobs.fixed)}


async def _sized(
    client: httpx.AsyncClient, endpoint: Endpoint, knobs: Knobs, suites: list[str], say: OnNote
) -> tuple[Knobs, dict[str, Any]]:
    """``knobs`` sized by :func:`~sparkfold.bench.plan.plan` from one measured request."""
    body = {
        "model": endpoint.model,
        "messages": messages(next(iter(KINDS)), 1_000),
        "max_tokens": 32,
        "temperature": 0,
    }
    probe = await stream_chat(client, body)
    rate = probe.decode_tok_s or 0.0
    start = Plan(knobs.levels, knobs.rounds, knobs.warmup, knobs.max_tokens, knobs.exact_tokens)
    chosen = plan(rate, knobs.budget_s, start, knobs.fixed, knobs.exact_requests)
    sized = replace(
        knobs,
        levels=chosen.levels,
        rounds=chosen.rounds,
        warmup=chosen.warmup,
        max_tokens=chosen.max_tokens,
        exact_tokens=chosen.exact_tokens,
    )
    info = {"probe_tok_s": round(rate, 2), "probe_ttft_s": probe.ttft_s, "budget_s": knobs.budget_s} | asdict(
        chosen
    )
    if {"prefill", "reuse"} & set(suites):
        sized, prompts = await _sized_prompts(client, endpoint, sized)
        info |= asdict(prompts)
        if prompts.prefill_tok_s:
            say(
                f"prefill ≥ {prompts.prefill_tok_s:.0f} tok/s: prefill lengths "
                f"{', '.join(map(str, sized.prefill_lengths or ()))} (each started while the rate "
                f"measured so far says it ends in the phase's {_phase_seconds(knobs, 'prefill'):.0f} s); "
                f"reuse {sized.reuse_tokens} and {sized.system_tokens} tokens"
            )
    if not probe.ok or not rate:
        say(
            f"the first request measured no decode rate ({probe.error or 'one token'}): the recipe's defaults"
        )
    else:
        total = sum(_expected(sized, info, suites).values())
        say(
            f"{rate:.1f} tok/s on one stream: decode at {','.join(map(str, chosen.levels))} streams, "
            f"{chosen.rounds} round(s), warm-up {chosen.warmup}, {chosen.max_tokens}-token replies; exact "
            f"{chosen.exact_tokens}-token replies; about {total:.0f} s for {', '.join(suites)} "
            f"(--time-budget {knobs.budget_s:g})"
        )
    return sized, info


async def _sized_prompts(
    client: httpx.AsyncClient, endpoint: Endpoint, knobs: Knobs
) -> tuple[Knobs, Prompts]:
    """``knobs``' long prompts sized by :func:`~sparkfold.bench.plan.long_prompts` from a ~1,000-word
    prompt's time to first token (those the user set kept)."""
    body = {
        "model": endpoint.model,
        "messages": [{"role": "user", "content": filler(1_000, seed=99) + "\nSay OK."}],
        "max_tokens": 1,
        "temperature": 0,
    }
    probe = await stream_chat(client, body)
    rate = (probe.prompt_tokens or 0) / probe.ttft_s if probe.ok and probe.ttft_s else 0.0
    window = knobs.window or endpoint.window or 32_768
    if not rate:
        return knobs, Prompts(knobs.prefill_lengths or (), knobs.reuse_tokens, knobs.system_tokens, 0.0)
    lengths = prefill_lengths(window, knobs.prefill_lengths)
    sized = long_prompts(rate, knobs.budget_s, lengths, knobs.reuse_tokens, knobs.system_tokens)
    fixed = knobs.fixed
    return replace(
        knobs,
        prefill_lengths=knobs.prefill_lengths if "prefill_lengths" in fixed else sized.prefill_lengths,
        reuse_tokens=knobs.reuse_tokens if "reuse_tokens" in fixed else sized.reuse_tokens,
        system_tokens=knobs.system_tokens if "system_tokens" in fixed else sized.system_tokens,
    ), sized


def _phase_seconds(knobs: Knobs, name: str) -> float:
    """A phase's deadline: ``--max-seconds``, within its share of a time budget when there is one."""
    if knobs.budget_s > 0:
        return min(knobs.max_seconds, PHASE_SHARES[name] * knobs.budget_s)
    return knobs.max_seconds


def _expected(knobs: Knobs, sized: dict[str, Any] | None, suites: list[str]) -> dict[str, float]:
    """Seconds each suite is expected to take: the plan's decode and exactness estimates, and the
    phase deadline of the others (an upper bound); 0 without a plan."""
    if not sized:
        return dict.fromkeys(suites, 0.0)
    planned = {"decode": sized.get("decode_s", 0.0), "exact": sized.get("exact_s", 0.0)}
    return {
        name: min(planned.get(name, knobs.max_seconds), PHASE_SHARES[name] * knobs.budget_s)
        for name in suites
    }


def run(
    url: str,
    suites: list[str],
    knobs: Knobs,
    *,
    api_key: str | None = None,
    model: str | None = None,
    on_suite: OnSuite = lambda result: None,
    on_note: OnNote = lambda line: None,
) -> dict[str, Any]:
    """Run ``suites`` against ``url`` (the gateway, an engine server or a router); ``on_suite``
    gets the result so far after each suite (so a run cut short keeps what it measured);
    ``on_note`` the plan a time budget made and the time left after each suite."""
    return asyncio.run(_run(url, suites, knobs, api_key, model, on_suite, on_note))


def total_errors(result: dict[str, Any]) -> int:
    return sum(int(suite.get("errors", 0)) for suite in result.get("suites", {}).values())
