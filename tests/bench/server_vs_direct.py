"""The harness both engine benchmarks share: the same load sent to an engine server and to a loop
that drives the engine directly (no HTTP), measured in turns, level by level.

A direct loop is anything with ``round(texts, tokens) -> {"tok_s": …, "ttft_s": …}`` that runs
the texts as concurrent jobs of exactly ``tokens`` greedy tokens each. The server side streams the
same prompts as ``/v1/completions`` with ``ignore_eos`` (exactly ``tokens`` tokens: no stop token
ends a reply on either side, so both do the same work; a round pair whose token counts differ
is reported as unequal work). At each level, each side runs one short warm-up round (first-use
costs are not what is measured), then ``rounds`` measured rounds interleaved (server, direct,
server, direct …), each pair on the same prompts, so drift on the machine hits both sides alike.
Reported per level: each side's median tok/s and TTFT with the lowest and highest round, and the
ratio = server / direct as the median of the per-round ratios (each server round over the direct
round right after it) with its lowest and highest; no ratio is printed (``–``) where the rounds
spread wider than the ratio's distance from 1, and ``≈ 1`` where every round is within ±5 % of
parity (:func:`verdict`). ``--compare A.json B.json``
sets two runs side by side, level by level, and calls them agreeing within ±5 %.

The defaults (384 tokens, 4 rounds) are what it takes on the H200's bench-size fixture for two
runs to agree within ±5 %: rounds of 128 tokens (1.4 to 5 s) scattered by ±30 % from one run to
the next.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import httpx

__all__ = [
    "LEVELS",
    "DirectLoop",
    "GeneratorLoop",
    "Report",
    "add_arguments",
    "compare",
    "levels",
    "parse_levels",
    "prompts",
    "server_round",
    "verdict",
]

LEVELS = (1, 4, 8, 16)
PROMPT_WORDS = 100
WARM_TOKENS = 16


class DirectLoop(Protocol):
    def round(self, texts: list[str], tokens: int) -> dict[str, float]: ...


class GeneratorLoop:
    """An exllamav3-shaped generator driven directly: a round enqueues its jobs together and
    iterates until done, counting tokens and each job's time to its first one."""

    def __init__(self, exl: Any, torch: Any, generator: Any, hf: Any) -> None:
        self.exl, self.torch, self.generator, self.hf = exl, torch, generator, hf

    def jobs(self, texts: list[str], tokens: int) -> list[Any]:
        """One greedy job of exactly ``tokens`` new tokens per text (no stop conditions)."""
        exl, torch = self.exl, self.torch
        return [
            exl.Job(
                torch.tensor([self.hf.encode(text)], dtype=torch.long),
                max_new_tokens=tokens,
                sampler=exl.ArgmaxSampler(),
                stop_conditions=[],
            )
            for text in texts
        ]

    def on_tokens(self, result: dict[str, Any], ids: Any) -> None:
        """Called with each result that carries new tokens (a variant hands them on)."""

    def round(self, texts: list[str], tokens: int) -> dict[str, float]:
        jobs = self.jobs(texts, tokens)
        started = time.perf_counter()
        first: dict[Any, float] = {}
        generated = 0
        self.generator.enqueue(jobs)
        while self.generator.num_remaining_jobs():
            for result in self.generator.iterate():
                ids = result.get("token_ids")
                if ids is not None and ids.numel():
                    first.setdefault(result["job"], time.perf_counter() - started)
                    generated += int(ids.numel())
                    self.on_tokens(result, ids)
        wall = time.perf_counter() - started
        return {"tok_s": generated / wall, "ttft_s": statistics.mean(first.values()), "tokens": generated}


def prompts(count: int, tag: str) -> list[str]:
    """``count`` new ~100-word prompts; ``tag`` makes them unlike every other round's."""
    rng = random.Random(0)
    words = ["amber", "basalt", "cinder", "delta", "ember", "fjord", "granite", "harbor", "iris", "jade"]
    return [f"{tag}-{i} " + " ".join(rng.choice(words) for _ in range(PROMPT_WORDS)) for i in range(count)]


async def _stream(client: httpx.AsyncClient, prompt: str, tokens: int) -> tuple[float, int]:
    body = {"prompt": prompt, "max_tokens": tokens, "temperature": 0, "ignore_eos": True, "stream": True}
    started = time.perf_counter()
    ttft = 0.0
    count = 0
    async with client.stream("POST", "/v1/completions", json=body) as response:
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                count = int(event["usage"]["completion_tokens"])
            elif not ttft and event.get("choices") and event["choices"][0].get("text"):
                ttft = time.perf_counter() - started
    return ttft, count


async def server_round(url: str, texts: list[str], tokens: int) -> dict[str, float]:
    async with httpx.AsyncClient(
        base_url=url, timeout=600, limits=httpx.Limits(max_connections=64)
    ) as client:
        started = time.perf_counter()
        done = await asyncio.gather(*(_stream(client, t, tokens) for t in texts))
        wall = time.perf_counter() - started
    return {
        "tok_s": sum(c for _, c in done) / wall,
        "ttft_s": statistics.mean(t for t, _ in done),
        "wall_s": wall,
        "tokens": sum(c for _, c in done),
    }


def _median(rounds: list[dict[str, float]]) -> dict[str, Any]:
    """Median tok/s and TTFT of a side's rounds, and the lowest and highest tok/s."""
    rates = [r["tok_s"] for r in rounds]
    return {
        "tok_s": statistics.median(rates),
        "ttft_s": statistics.median(r["ttft_s"] for r in rounds),
        "tok_s_min": min(rates),
        "tok_s_max": max(rates),
    }


def _ratios(runs: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    """server / direct per round pair (interleaved: each server round with the direct one after it),
    and whether every pair generated the same number of tokens."""
    pairs = list(zip(runs["server"], runs["direct"], strict=True))
    ratios = [s["tok_s"] / d["tok_s"] for s, d in pairs]
    equal = all(s.get("tokens") == d.get("tokens") for s, d in pairs)
    return {
        "ratio": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "equal_work": equal,
    }


AGREE = 0.05
"""Two runs agree at a level when their ratios are within ±5 % of each other; a range within ±5 %
of 1 is parity."""


def verdict(ratio: float, low: float, high: float, equal_work: bool = True) -> str:
    """The ratio with its range; ``≈ 1`` when the whole range lies within ±``AGREE`` of 1 (the
    sides are at parity to the precision the runs have); or ``–`` and why not: the two sides did
    different work, or the runs spread wider than the effect (half the range > the ratio's distance
    from 1, or the range holds 1: the runs do not agree on which side is faster)."""
    if not equal_work:
        return "– (unequal work)"
    if low >= 1 - AGREE and high <= 1 + AGREE:
        return f"≈ 1 ({low:.2f}–{high:.2f}: parity within ±{AGREE * 100:.0f} %)"
    if (high - low) / 2 > abs(ratio - 1) or low <= 1 <= high:
        return f"– ({low:.2f}–{high:.2f}: spread > effect)"
    return f"{ratio:.2f} ({low:.2f}–{high:.2f})"


def levels(
    url: str,
    direct: DirectLoop,
    tokens: int,
    rounds: int,
    at: Sequence[int] = LEVELS,
    on_level: Callable[[int, dict[str, Any]], None] = lambda level, sides: None,
) -> dict[int, dict[str, Any]]:
    """Both sides at every level: a warm-up round each, then ``rounds`` measured rounds in turns."""
    out: dict[int, dict[str, Any]] = {}
    for level in at:
        asyncio.run(server_round(url, prompts(level, f"warm-s{level}"), WARM_TOKENS))
        direct.round(prompts(level, f"warm-d{level}"), WARM_TOKENS)
        runs: dict[str, list[dict[str, float]]] = {"server": [], "direct": []}
        for r in range(rounds):
            texts = prompts(level, f"r{level}-{r}")  # the same prompts on both sides
            runs["server"].append(asyncio.run(server_round(url, texts, tokens)))
            runs["direct"].append(direct.round(texts, tokens))
        out[level] = {side: _median(rs) for side, rs in runs.items()}
        out[level] |= {"rounds": runs, **_ratios(runs)}
        on_level(level, out[level])
    return out


class Report:
    """Prints each level's row as it comes, and keeps the JSON file up to date."""

    def __init__(self, json_path: Path | None) -> None:
        self.json_path = json_path
        self.rows: list[dict[str, Any]] = []
        self.prefix_reuse: dict[str, float] | None = None
        print(
            "| concurrent | direct tok/s (lowest–highest) | server tok/s (lowest–highest) "
            "| ratio (lowest–highest) | direct TTFT s | server TTFT s |"
        )
        print("| --- | --- | --- | --- | --- | --- |", flush=True)

    def level(self, level: int, sides: dict[str, Any]) -> None:
        d, s = sides["direct"], sides["server"]
        self.rows.append(
            {
                "concurrent": level,
                "direct": d,
                "server": s,
                "ratio": sides["ratio"],
                "ratio_min": sides["ratio_min"],
                "ratio_max": sides["ratio_max"],
                "equal_work": sides["equal_work"],
                "rounds": sides["rounds"],
            }
        )
        cells = [
            f"{d['tok_s']:.0f} ({d['tok_s_min']:.0f}–{d['tok_s_max']:.0f})",
            f"{s['tok_s']:.0f} ({s['tok_s_min']:.0f}–{s['tok_s_max']:.0f})",
            verdict(sides["ratio"], sides["ratio_min"], sides["ratio_max"], sides["equal_work"]),
            f"{d['ttft_s']:.3f}",
            f"{s['ttft_s']:.3f}",
        ]
        print(f"| {level} | " + " | ".join(cells) + " |", flush=True)
        self._write()

    def reuse(self, result: dict[str, float]) -> None:
        self.prefix_reuse = result
        print(f"prefix reuse: {result}", flush=True)
        self._write()

    def _write(self) -> None:
        if self.json_path:
            data = {"levels": self.rows, "prefix_reuse": self.prefix_reuse}
            self.json_path.write_text(json.dumps(data, indent=2) + "\n")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--json``, ``--tokens``, ``--rounds`` and ``--levels``."""
    parser.add_argument("--json", type=Path, help="write the results here (rewritten after every level)")
    parser.add_argument("--tokens", type=int, default=384, help="tokens per request")
    parser.add_argument("--rounds", type=int, default=4, help="measured rounds per side and level")
    parser.add_argument("--levels", default=",".join(map(str, LEVELS)), help="comma-separated concurrencies")


def parse_levels(parser: argparse.ArgumentParser, text: str) -> list[int]:
    try:
        at = [int(n) for n in text.split(",")]
    except ValueError:
        at = []
    if not at or any(n < 1 or n > max(LEVELS) for n in at):
        parser.error(f"--levels: a comma-separated list of concurrencies from 1 to {max(LEVELS)}")
    return at


def compare(paths: Sequence[Path]) -> list[str]:
    """Markdown rows setting several runs' JSON files side by side, level by level: each run's
    ratio, whether they agree (within ``AGREE``), and the ratio they support together (their
    median; ``–`` when they spread wider than its distance from 1, or a run did unequal work)."""
    runs = [{row["concurrent"]: row for row in json.loads(path.read_text())["levels"]} for path in paths]
    rows = ["| concurrent | ratio per run | runs agree (±5 %) | ratio |", "| --- | --- | --- | --- |"]
    for level in sorted(set.intersection(*(set(run) for run in runs))):
        ratios = [run[level]["ratio"] for run in runs]
        agree = max(ratios) / min(ratios) - 1 <= AGREE
        equal = all(run[level].get("equal_work", False) for run in runs)
        shown = verdict(statistics.median(ratios), min(ratios), max(ratios), equal)
        rows.append(
            f"| {level} | {' / '.join(f'{r:.2f}' for r in ratios)} | {'yes' if agree else 'no'} | {shown} |"
        )
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="set benchmark runs side by side")
    parser.add_argument("--compare", nargs="+", type=Path, required=True, help="two or more JSON files")
    print("\n".join(compare(parser.parse_args().compare)))
