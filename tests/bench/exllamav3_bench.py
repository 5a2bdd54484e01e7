"""The exllamav3 engine server against exllamav3's own generator loop, on the same model and GPU.

In one run, on one EXL3 (or unconverted bf16) model, both sides loaded at once and measured in
turns (server, direct, server, direct … at each level), so both see the same GPU:

1. exllamav3 driven directly (``Generator.enqueue`` + ``iterate`` in this process, no HTTP): at 1,
   4, 8 and 16 concurrent jobs, aggregate generated tokens/s and mean time to first token;
2. ``sparkfold engine`` (kind exllamav3) in a child process, the same prompts as streamed
   ``/v1/completions`` at the same concurrencies: aggregate tokens/s and mean TTFT;
   ratio = server / direct;
3. prefix reuse through the server: TTFT of a long prompt sent twice (speedup = first / second).

Both sides run exllamav3's ``Model.warmup`` after loading (the server at its start), and before
its first measured round at a level, each side runs one short warm-up round at that level
(first-use allocations and kernel choices are not what is measured); then ``--rounds``
measured rounds each, taking turns; each side's median tokens/s and median TTFT count. Every
prompt is new to its side (no prefix reuse between rounds; a round pair sends both sides the same
prompts). Every request generates exactly ``--tokens`` tokens, greedy: ``ignore_eos`` on the
server (no stop token ends a reply), no stop conditions in the direct loop; the same work on
both sides, checked per round pair (``equal_work``). A ratio whose rounds spread wider than its
distance from 1 is printed as ``–``; ``python tests/bench/server_vs_direct.py --compare A.json
B.json`` sets two runs side by side.

    python tests/bench/exllamav3_bench.py MODEL_DIR [--json FILE] [--tokens 128] [--rounds 4]
        [--levels 1,4,8,16] [--servers core,core-omp,plain,omp]

``--servers`` measures each named engine server against the same direct loop, one after another
(each with its own JSON, ``FILE`` with ``-NAME`` before the suffix when there are several):
``core`` (the default: what a user's one-GPU engine runs) is the server with ``[engine]
core_process = true`` (the engine in a process of its own), ``core-omp`` that without
``OMP_NUM_THREADS=1``, ``plain`` the server with the engine in the same process
(``core_process = false``, ``OMP_NUM_THREADS=1``), ``omp`` that without the variable.

Each level's row is printed (and the JSON file rewritten) as soon as it is measured, so a run cut
short by a time limit still leaves the levels it finished.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.bench.server_vs_direct import LEVELS, GeneratorLoop, Report, add_arguments, levels, parse_levels
from tests.gpu.gpu_engine import child_env
from tests.integration.engine_procs import EngineProcess, free_port, wait_healthy, write_config

POOL_TOKENS = 65_536


class Direct(GeneratorLoop):
    """exllamav3's own loop on the model: one generator, as the engine server has."""

    def __init__(self, model_dir: Path) -> None:
        import exllamav3 as exl
        import torch
        from transformers import AutoTokenizer

        config = exl.Config.from_directory(str(model_dir))
        self.model = exl.Model.from_config(config)
        self.cache = exl.Cache(self.model, max_num_tokens=POOL_TOKENS, max_batch_size=max(LEVELS))
        self.model.load(max_batch_size=max(LEVELS))
        self.model.warmup(cache=self.cache, max_batch_size=max(LEVELS), max_q_len=1)  # as the server does
        generator = exl.Generator(
            self.model, self.cache, exl.Tokenizer.from_config(config), max_batch_size=max(LEVELS)
        )
        hf = AutoTokenizer.from_pretrained(str(model_dir))
        super().__init__(exl, torch, generator, hf)

    def close(self) -> None:
        self.model.unload()
        del self.generator, self.cache, self.model
        self.torch.cuda.empty_cache()


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


SERVERS: dict[str, tuple[dict[str, str | None], dict[str, bool]]] = {
    "plain": ({}, {"core_process": False}),
    "omp": ({"OMP_NUM_THREADS": None}, {"core_process": False}),
    "core": ({}, {"core_process": True}),
    "core-omp": ({"OMP_NUM_THREADS": None}, {"core_process": True}),
}
"""``--servers``: each name's environment changes and ``[engine]`` keys."""


@contextlib.contextmanager
def serve(
    model_dir: Path,
    log_dir: Path,
    name: str,
    *,
    max_tokens: int,
    context: int = 16_384,
    server: str = "core",
) -> Iterator[tuple[str, EngineProcess]]:
    """``sparkfold engine`` (kind exllamav3, 16 lanes, a ``POOL_TOKENS`` pool) on the model in a
    child process, set up as ``SERVERS[server]``; yields its URL and process once healthy, stops it after."""
    env, engine = SERVERS[server]
    port = free_port()
    config = write_config(
        log_dir / f"{name}.toml",
        model_dir,
        kind="exllamav3",
        port=port,
        served_name="glm",
        context=context,
        max_tokens=max_tokens,
        parallel=max(LEVELS),
        **engine,
    )
    pool = max(POOL_TOKENS, 2 * context)
    config.write_text(config.read_text() + f"[engine.exllamav3]\npool_tokens = {pool}\n")
    proc = EngineProcess(config, log_dir / f"engine-{name}-{model_dir.name}.log", env={**child_env(), **env})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, deadline_s=400)
        yield url, proc
    finally:
        proc.stop()


def measure(
    model_dir: Path,
    tokens: int,
    rounds: int,
    at: Sequence[int],
    log_dir: Path,
    json_path: Path | None,
    servers: Sequence[str] = ("core",),
) -> None:
    direct = Direct(model_dir)
    try:
        for server in servers:
            path = json_path
            if path is not None and len(servers) > 1:
                path = path.with_name(f"{path.stem}-{server}{path.suffix}")
            print(f"server: {server}", flush=True)
            report = Report(path)
            with serve(model_dir, log_dir, f"bench-{server}", max_tokens=tokens, server=server) as (url, _):
                levels(url, direct, tokens, rounds, at, report.level)
                report.reuse(_prefix_reuse(url))
    finally:
        direct.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    add_arguments(parser)
    parser.add_argument(
        "--servers", default="core", help=f"comma-separated engine servers to measure: {', '.join(SERVERS)}"
    )
    args = parser.parse_args()
    at = parse_levels(parser, args.levels)
    servers = args.servers.split(",")
    if not servers or any(name not in SERVERS for name in servers):
        parser.error(f"--servers: a comma-separated list of {', '.join(SERVERS)}")
    log_dir = args.json.parent if args.json else Path(tempfile.mkdtemp(prefix="exl3-bench-"))
    measure(args.model, args.tokens, args.rounds, at, log_dir, args.json, servers)


if __name__ == "__main__":
    main()
