"""What our exllamav3 engine server costs when the engine itself is CPU-bound, measured on a CPU.

On a small model the GPU waits for Python: each of exllamav3's steps is mostly Python holding
the GIL, and the engine server's own work (turning tokens into text and SSE events, HTTP) runs
in the same process, so it competes for that GIL. This benchmark isolates that cost without a
GPU: the engine server of ``kind = "exllamav3"`` (``Exllamav3Generator`` + the engine protocol
server, uvicorn, one child process) runs over :class:`tests.fakes.busy_exllamav3.BusyGenerator`,
a stand-in whose steps spin Python for ``--step-ms × --gil-share`` and sleep the rest, with
exllamav3's admission rule (prefill cooldown); the same stand-in driven directly in this
process (no HTTP) is the baseline. Load, levels and rounds as ``tests/bench/server_vs_direct.py``
describes; ratio = server / direct.

It also reports what the ratio hides on a busy machine: the CPU time the server's event-loop
thread spends per streamed token (``/proc``'s count for that thread over three rounds of 16
streams, divided by the tokens), the number that decides how much an engine that needs the GIL
all the time is slowed down.

    python tests/bench/engine_overhead_bench.py [--step-ms 20] [--gil-share 0.8] [--gather-ms 3]
        [--prefill-cooldown 0] [--shared-chunk full] [--json FILE] [--tokens 128] [--rounds 4]
        [--levels 1,4,8,16]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.bench.server_vs_direct import (
    LEVELS,
    GeneratorLoop,
    Report,
    add_arguments,
    levels,
    parse_levels,
    prompts,
    server_round,
)
from tests.fakes.busy_exllamav3 import BUSY_EXL, BusyGenerator
from tests.integration.engine_procs import ChildProcess, free_port, wait_healthy

CONTEXT = 16_384


def _busy(args: argparse.Namespace) -> BusyGenerator:
    return BusyGenerator(
        args.step_ms / 1000,
        args.gil_share,
        max_batch=max(LEVELS),
        prefill_cooldown=args.prefill_cooldown,
        shared_chunk_full=args.shared_chunk == "full",
    )


def _tokenizer(directory: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(directory))


def serve(args: argparse.Namespace) -> None:
    """The child: our exllamav3 engine server over the busy stand-in, until killed."""
    import torch
    import uvicorn

    from sparkfold.engines.exllamav3 import Exllamav3Generator, Lane
    from sparkfold.engines.server import create_app
    from sparkfold.engines.service import EngineService

    tokenizer = _tokenizer(args.tokenizer)
    generator = Exllamav3Generator(
        BUSY_EXL,
        torch,
        [Lane("main", _busy(args), 65_536)],
        tokenizer,
        context_length=CONTEXT,
        parallel=max(LEVELS),
        eos_token_ids=frozenset({tokenizer.eos_token_id}),
        vocab_size=len(tokenizer),
        gather_s=args.gather_ms / 1000,
    )
    service = EngineService(generator, served_name="glm", max_tokens=args.tokens)
    uvicorn.run(create_app(service), host="127.0.0.1", port=args.serve, log_level="warning", lifespan="off")


def _thread_cpu_s(pid: int, tid: int) -> float:
    fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def loop_cpu_per_token(url: str, pid: int, tokens: int, rounds: int = 3, streams: int = 16) -> float:
    """Microseconds of CPU the server's main (event-loop) thread spends per streamed token."""
    before = _thread_cpu_s(pid, pid)
    generated = 0.0
    for r in range(rounds):
        result = asyncio.run(server_round(url, prompts(streams, f"cpu-{r}"), tokens))
        generated += result["tok_s"] * result["wall_s"]
    return (_thread_cpu_s(pid, pid) - before) / generated * 1e6


def measure(args: argparse.Namespace, at: list[int], report: Report) -> None:
    import torch

    from sparkfold.testing.tiny_glm import write_tiny_glm

    workdir = Path(tempfile.mkdtemp(prefix="overhead-bench-"))
    tokenizer_dir = write_tiny_glm(workdir / "tiny-glm")  # the GLM-shaped tokenizer (and a tiny model)
    port = free_port()
    argv = [sys.executable, __file__, "--serve", str(port), "--tokenizer", str(tokenizer_dir)]
    argv += ["--step-ms", str(args.step_ms), "--gil-share", str(args.gil_share)]
    argv += ["--gather-ms", str(args.gather_ms), "--tokens", str(args.tokens)]
    argv += ["--prefill-cooldown", str(args.prefill_cooldown), "--shared-chunk", args.shared_chunk]
    child = ChildProcess(argv, workdir / "server.log")
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, child, deadline_s=120)
        direct = GeneratorLoop(BUSY_EXL, torch, _busy(args), _tokenizer(tokenizer_dir))
        levels(url, direct, args.tokens, args.rounds, at, report.level)
        cpu_us = loop_cpu_per_token(url, child.proc.pid, args.tokens)
        print(f"server event-loop thread: {cpu_us:.0f} µs CPU per token", flush=True)
    finally:
        child.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    parser.add_argument("--step-ms", type=float, default=20.0, help="one engine step, in milliseconds")
    parser.add_argument("--gil-share", type=float, default=0.8, help="share of a step that holds the GIL")
    parser.add_argument(
        "--gather-ms", type=float, default=3.0, help="the server's [engine.exllamav3] gather_ms"
    )
    parser.add_argument("--prefill-cooldown", type=int, default=0, help="[engine.exllamav3] prefill_cooldown")
    parser.add_argument(
        "--shared-chunk",
        choices=["full", "half"],
        default="full",
        help="shared_chunk_tokens: the full chunk (sparkfold's default) or half (exllamav3's)",
    )
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--tokenizer", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not 0 <= args.gil_share <= 1:
        parser.error("--gil-share is a fraction from 0 to 1")
    if args.serve:
        serve(args)
        return
    at = parse_levels(parser, args.levels)
    print(
        f"step {args.step_ms} ms, {args.gil_share:.0%} of it holding the GIL; gather_ms {args.gather_ms}, "
        f"prefill_cooldown {args.prefill_cooldown}, shared chunk {args.shared_chunk}"
    )
    measure(args, at, Report(args.json))


if __name__ == "__main__":
    main()
