"""Does the engine server's generator configuration, or its plumbing, cost the throughput?

exllamav3's loop driven directly, in one process, on one model, three ways, measured in
interleaved rounds (the same kind of jobs as ``exllamav3_bench.py``, new prompts every round):

- ``default``: ``Generator(model, cache, tokenizer, max_batch_size=16)``, jobs as the direct side
  of ``exllamav3_bench.py`` builds them;
- ``server-config``: the generator built with the engine server's keyword arguments at its
  defaults (``max_chunk_size=2048``, ``prefill_cooldown=0``, ``shared_chunk_size=2048``,
  ``recurrent_cache_size`` 4 GiB), same jobs;
- ``server-jobs``: that generator, and jobs built as the server builds them (``seed``,
  ``decode_special_tokens=True``);
- ``loop-thread``: the default generator, and every token handed to an asyncio event loop in a
  second thread (``call_soon_threadsafe`` per token, as the server's engine thread hands tokens to
  its HTTP side) that encodes an SSE chunk for it: the shared interpreter without HTTP;
- ``engine``: sparkfold's engine as the server loads it (``engines.exllamav3.loading.load``: its
  own model, pool, generator settings and engine thread), driven by ``generate()`` from an event
  loop in this thread: everything the server runs except HTTP, SSE and the GLM output parsing.
- ``engine-stops`` (only when named in ``--only``): ``engine`` with the GLM stop tokens the server
  puts on every request (``SamplingParams.stop_token_ids``, exllamav3's ``stop_conditions``).

If ``server-config`` or ``server-jobs`` loses against ``default`` what the server loses against the
direct loop, the cost is in the configuration, not in HTTP, threads or the GIL; if ``engine``
keeps up with ``default`` while the server does not, the cost is in the HTTP side sharing the
engine's interpreter.

    python tests/bench/exllamav3_ab.py MODEL_DIR [--levels 4,8] [--tokens 256] [--rounds 3] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.bench.server_vs_direct import GeneratorLoop, prompts

POOL_TOKENS = 65_536
GIB = 1 << 30


class Variant(GeneratorLoop):
    def __init__(self, exl: Any, torch: Any, generator: Any, hf: Any, job_kwargs: dict[str, Any]) -> None:
        super().__init__(exl, torch, generator, hf)
        self.job_kwargs = job_kwargs

    def round(self, texts: list[str], tokens: int) -> dict[str, float]:
        job = self.exl.Job
        self.exl.Job = lambda *a, **k: job(*a, **(k | self.job_kwargs))  # type: ignore[misc]
        try:
            return super().round(texts, tokens)
        finally:
            self.exl.Job = job


class LoopThread(GeneratorLoop):
    """The default loop, with each token handed to an event loop in another thread."""

    def __init__(self, exl: Any, torch: Any, generator: Any, hf: Any) -> None:
        super().__init__(exl, torch, generator, hf)
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.sent = 0

    def _encode(self, token: int, text: str) -> None:
        chunk = {
            "id": "cmpl",
            "object": "text_completion",
            "choices": [{"index": 0, "text": text, "token": token}],
        }
        self.sent += len(b"data: " + json.dumps(chunk).encode() + b"\n\n")

    def on_tokens(self, result: dict[str, Any], ids: Any) -> None:
        for token in ids.flatten().tolist():
            self.loop.call_soon_threadsafe(self._encode, token, result.get("text") or "")


class Engine:
    """sparkfold's exllamav3 engine (the server's generator and engine thread), no HTTP."""

    def __init__(self, model_dir: Path, tokens: int, *, stops: bool = False) -> None:
        """``stops``: with the GLM stop tokens the server puts on every request (``engine-stops``)."""
        from sparkfold.config import EngineSettings
        from sparkfold.engines.exllamav3.loading import load

        settings = EngineSettings.model_validate(
            {
                "kind": "exllamav3",
                "model": str(model_dir),
                "context": 16_384,
                "max_tokens": tokens,
                "parallel": 16,
                "exllamav3": {"pool_tokens": POOL_TOKENS},
            }
        )
        self.generator = load(settings).generator
        glm = self.generator.glm
        self.stop_token_ids = frozenset(glm.stop_token_ids) if stops and glm is not None else frozenset()

    async def _reply(self, text: str, tokens: int) -> int:
        from sparkfold.engines.generator import SamplingParams

        params = SamplingParams(max_tokens=tokens, ignore_eos=True, stop_token_ids=self.stop_token_ids)
        stream = self.generator.generate(self.generator.encode(text), params, threading.Event())
        return sum([1 async for _ in stream])

    def round(self, texts: list[str], tokens: int) -> dict[str, float]:
        async def all_of_them() -> int:
            return sum(await asyncio.gather(*(self._reply(t, tokens) for t in texts)))

        started = time.perf_counter()
        generated = asyncio.run(all_of_them())
        return {"tok_s": generated / (time.perf_counter() - started), "ttft_s": 0.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--levels", default="4,8")
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--only", default="", help="comma-separated variants (default: all)")
    args = parser.parse_args()
    import exllamav3 as exl
    import torch
    from transformers import AutoTokenizer

    config = exl.Config.from_directory(str(args.model))
    model = exl.Model.from_config(config)
    caches = [exl.Cache(model, max_num_tokens=POOL_TOKENS, max_batch_size=16) for _ in range(2)]
    model.load(max_batch_size=16, max_chunk_size=2048)
    tok = exl.Tokenizer.from_config(config)
    hf = AutoTokenizer.from_pretrained(str(args.model))
    plain = exl.Generator(model, caches[0], tok, max_batch_size=16)
    server_kwargs = {
        "max_batch_size": 16,
        "max_chunk_size": 2048,
        "prefill_cooldown": 0,
        "shared_chunk_size": 2048,
        "recurrent_cache_size": 4 * GIB,
    }
    served = exl.Generator(model=model, cache=caches[1], tokenizer=tok, **server_kwargs)
    variants: dict[str, Any] = {
        "default": Variant(exl, torch, plain, hf, {}),
        "server-config": Variant(exl, torch, served, hf, {}),
        "server-jobs": Variant(exl, torch, served, hf, {"seed": 0, "decode_special_tokens": True}),
        "loop-thread": LoopThread(exl, torch, plain, hf),
    }
    if args.only:
        variants = {name: loop for name, loop in variants.items() if name in args.only.split(",")}
    if not args.only or "engine" in args.only.split(","):
        variants["engine"] = Engine(args.model, args.tokens)
    if "engine-stops" in args.only.split(","):
        variants["engine-stops"] = Engine(args.model, args.tokens, stops=True)
    result: dict[str, Any] = {}
    for level in [int(n) for n in args.levels.split(",")]:
        for name, loop in variants.items():
            loop.round(prompts(level, f"warm-{name}-{level}"), 16)
        rates: dict[str, list[float]] = {name: [] for name in variants}
        for r in range(args.rounds):
            for name, loop in variants.items():
                rates[name].append(loop.round(prompts(level, f"{name}-{level}-{r}"), args.tokens)["tok_s"])
        result[str(level)] = {
            name: {"median": statistics.median(v), "rounds": v} for name, v in rates.items()
        }
        base = result[str(level)]["default"]["median"]
        cells = ", ".join(
            f"{n} {d['median']:.0f} ({d['median'] / base:.2f})" for n, d in result[str(level)].items()
        )
        print(f"{level} concurrent: {cells}", flush=True)
        if args.json:  # after every level: a run cut short keeps what it measured
            args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
