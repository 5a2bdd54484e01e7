"""The exllamav3 engine server against exllamav3's own generator loop, on the same model and GPU.

In one run, on one EXL3 (or unconverted bf16) model, both sides loaded at once and measured in
turns (server, direct, server, direct … at each level), so both see the same GPU:

1. exllamav3 driven directly (``Generator.enqueue`` + ``iterate`` in this process, no HTTP): at 1,
   4, 8 and 16 concurrent jobs, aggregate generated tokens/s and mean time to first token;
2. ``sparkfold engine`` (kind exllamav3) in a child process, the same prompts as streamed
   ``/v1/completions`` at the same concurrencies: aggregate tokens/s and mean TTFT;
   ratio = server / direct;
3. prefix reuse through the server: TTFT of a long prompt sent twice (speedup = first / second).

Before its first measured round at a level, each side runs one short warm-up round at that
level (first-use allocations and kernel choices are not what is measured); then ``--rounds``
measured rounds each, taking turns; each side's median tokens/s and median TTFT count. Every
prompt is new (no prefix reuse between rounds). Every request generates exactly ``--tokens``
tokens (``ignore_eos``), greedy.

    python tests/bench/exllamav3_bench.py MODEL_DIR [--json FILE] [--tokens 128] [--rounds 4]
        [--levels 1,4,8,16]

Each level's row is printed (and the JSON file rewritten) as soon as it is measured, so a run cut
short by a time limit still leaves the levels it finished.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.gpu.gpu_engine import child_env
from tests.integration.engine_procs import EngineProcess, free_port, wait_healthy, write_config

LEVELS = (1, 4, 8, 16)
PROMPT_WORDS = 100
POOL_TOKENS = 65_536
WARM_TOKENS = 16


def prompts(count: int, tag: str) -> list[str]:
    """``count`` new ~100-word prompts; ``tag`` makes them unlike every other round's."""
    rng = random.Random(0)
    words = ["amber", "basalt", "cinder", "delta", "ember", "fjord", "granite", "harbor", "iris", "jade"]
    return [f"{tag}-{i} " + " ".join(rng.choice(words) for _ in range(PROMPT_WORDS)) for i in range(count)]


class Direct:
    """exllamav3's own loop: one generator; a round enqueues its jobs together and iterates until done."""

    def __init__(self, model_dir: Path) -> None:
        import exllamav3 as exl
        import torch
        from transformers import AutoTokenizer

        self.exl, self.torch = exl, torch
        config = exl.Config.from_directory(str(model_dir))
        self.model = exl.Model.from_config(config)
        self.cache = exl.Cache(self.model, max_num_tokens=POOL_TOKENS, max_batch_size=max(LEVELS))
        self.model.load(max_batch_size=max(LEVELS))
        self.generator = exl.Generator(
            self.model, self.cache, exl.Tokenizer.from_config(config), max_batch_size=max(LEVELS)
        )
        self.hf = AutoTokenizer.from_pretrained(str(model_dir))

    def round(self, texts: list[str], tokens: int) -> dict[str, float]:
        exl, torch = self.exl, self.torch
        jobs = [
            exl.Job(
                torch.tensor([self.hf.encode(text)], dtype=torch.long),
                max_new_tokens=tokens,
                sampler=exl.ArgmaxSampler(),
                stop_conditions=[],
            )
            for text in texts
        ]
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
        wall = time.perf_counter() - started
        return {"tok_s": generated / wall, "ttft_s": statistics.mean(first.values())}

    def close(self) -> None:
        self.model.unload()
        del self.generator, self.cache, self.model
        self.torch.cuda.empty_cache()


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


async def _server_round(url: str, texts: list[str], tokens: int) -> dict[str, float]:
    async with httpx.AsyncClient(
        base_url=url, timeout=600, limits=httpx.Limits(max_connections=64)
    ) as client:
        started = time.perf_counter()
        done = await asyncio.gather(*(_stream(client, t, tokens) for t in texts))
        wall = time.perf_counter() - started
    return {"tok_s": sum(c for _, c in done) / wall, "ttft_s": statistics.mean(t for t, _ in done)}


def _median(rounds: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(r[key] for r in rounds) for key in ("tok_s", "ttft_s")}


def levels(
    url: str,
    direct: Direct,
    tokens: int,
    rounds: int,
    at: Sequence[int] = LEVELS,
    on_level: Callable[[int, dict[str, Any]], None] = lambda level, sides: None,
) -> dict[int, dict[str, Any]]:
    """Both sides at every level: a warm-up round each, then ``rounds`` measured rounds in turns."""
    out: dict[int, dict[str, Any]] = {}
    for level in at:
        asyncio.run(_server_round(url, prompts(level, f"warm-s{level}"), WARM_TOKENS))
        direct.round(prompts(level, f"warm-d{level}"), WARM_TOKENS)
        runs: dict[str, list[dict[str, float]]] = {"server": [], "direct": []}
        for r in range(rounds):
            runs["server"].append(asyncio.run(_server_round(url, prompts(level, f"s{level}-{r}"), tokens)))
            runs["direct"].append(direct.round(prompts(level, f"d{level}-{r}"), tokens))
        out[level] = {side: _median(rs) for side, rs in runs.items()}
        out[level]["rounds"] = runs
        on_level(level, out[level])
    return out


def _prefix_reuse(url: str) -> dict[str, float]:
    rng = random.Random(5)
    text = " ".join(f"w{rng.randrange(1000)}" for _ in range(2_000))
    with httpx.Client(base_url=url, timeout=600) as client:
        runs = []
        for _ in range(2):
            body = {"prompt": text, "max_tokens": 1, "temperature": 0}
            reply = client.post("/v1/completions", json=body).json()
            runs.append(reply)
    first, second = (r["tensorfold"]["prefill_s"] for r in runs)
    return {
        "prompt_tokens": runs[0]["usage"]["prompt_tokens"],
        "cached_tokens": runs[1]["usage"]["prompt_tokens_details"]["cached_tokens"],
        "first_ttft_s": first,
        "second_ttft_s": second,
        "speedup": first / second if second else 0.0,
    }


class Report:
    """Prints each level's row as it comes, and keeps the JSON file up to date."""

    def __init__(self, json_path: Path | None) -> None:
        self.json_path = json_path
        self.rows: list[dict[str, Any]] = []
        self.prefix_reuse: dict[str, float] | None = None
        print("| concurrent | direct tok/s | server tok/s | ratio | direct TTFT s | server TTFT s |")
        print("| --- | --- | --- | --- | --- | --- |", flush=True)

    def level(self, level: int, sides: dict[str, Any]) -> None:
        d, s = sides["direct"], sides["server"]
        ratio = s["tok_s"] / d["tok_s"]
        self.rows.append(
            {"concurrent": level, "direct": d, "server": s, "ratio": ratio, "rounds": sides["rounds"]}
        )
        cells = [
            f"{d['tok_s']:.0f}",
            f"{s['tok_s']:.0f}",
            f"{ratio:.2f}",
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


def measure(
    model_dir: Path, tokens: int, rounds: int, at: Sequence[int], log_dir: Path, report: Report
) -> None:
    direct = Direct(model_dir)
    port = free_port()
    config = write_config(
        log_dir / "bench.toml",
        model_dir,
        kind="exllamav3",
        port=port,
        served_name="glm",
        context=16_384,
        max_tokens=tokens,
        parallel=max(LEVELS),
    )
    config.write_text(config.read_text() + f"[engine.exllamav3]\npool_tokens = {POOL_TOKENS}\n")
    proc = EngineProcess(config, log_dir / f"engine-bench-{model_dir.name}.log", env=child_env())
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, deadline_s=400)
        levels(url, direct, tokens, rounds, at, report.level)
        report.reuse(_prefix_reuse(url))
    finally:
        proc.stop()
        direct.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--levels", default=",".join(map(str, LEVELS)), help="comma-separated concurrencies")
    args = parser.parse_args()
    at = [int(n) for n in args.levels.split(",")]
    if not at or any(n < 1 or n > max(LEVELS) for n in at):
        parser.error(f"--levels: each level must be between 1 and {max(LEVELS)}")
    log_dir = args.json.parent if args.json else Path(tempfile.mkdtemp(prefix="exl3-bench-"))
    measure(args.model, args.tokens, args.rounds, at, log_dir, Report(args.json))


if __name__ == "__main__":
    main()
