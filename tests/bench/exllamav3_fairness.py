"""The exllamav3 engine's start and its fairness on a GPU: the figures of docs/benchmarks.md.

1. **Restart.** ``sparkfold engine`` (kind exllamav3, engine core) on MODEL_DIR with an empty state
   directory (its compile caches empty: the first start on a fresh machine), then again with the
   same state directory (a restart): each from launching the process to the first streamed token
   of a request, with the start line's phases (load, warm-up, first token) and the
   ``first``/``restart`` label the engine gave it. With ``--control``, a third start with an
   empty state directory again (the weights now in the page cache: what the caches alone save).
2. **Fairness.** On the restarted engine, ``sparkfold bench --suite fairness`` (the real CLI) for
   each ``--chunks`` size (``[engine.exllamav3] chunk_tokens``; the engine restarts in between):
   decoding streams and short requests, without and with a long prompt (the window).

Everything lands in OUT: ``restart.json``, one ``fairness-c<chunk>/`` folder per chunk size
(bench.md, bench.json, PNGs), the engines' logs. Bounded by ``--budget-s``: a step that would
start past it is skipped and says so.

    python tests/bench/exllamav3_fairness.py MODEL_DIR OUT [--chunks 2048,512] [--context 1048576]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.gpu.gpu_engine import child_env
from tests.integration.engine_procs import EngineProcess, free_port, write_config

READY_S = 600.0


def launch(
    model: Path, out: Path, name: str, state: Path, context: int, chunk: int, parallel: int
) -> tuple[str, EngineProcess, float]:
    """The engine process (its URL, process and launch time), with ``state`` as its state directory."""
    port = free_port()
    config = write_config(
        out / f"{name}.toml",
        model,
        kind="exllamav3",
        port=port,
        served_name="glm",
        context=context,
        max_tokens=512,
        parallel=parallel,
        thinking=False,
    )
    paths = f'[paths]\nstate_dir = "{state}"\ncache_dir = "{state}/cache"\n'
    config.write_text(config.read_text() + f"[engine.exllamav3]\nchunk_tokens = {chunk}\n" + paths)
    env = {key: None for key in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "EXLLAMAV3_TUNE_CACHE")}
    launched = time.monotonic()
    proc = EngineProcess(config, out / f"engine-{name}.log", env={**child_env(), **env})
    return f"http://127.0.0.1:{port}", proc, launched


def first_token(url: str, proc: EngineProcess, launched: float) -> dict[str, Any]:
    """Wait for the engine, stream one request: seconds from launch to ready and to its first token,
    and the start line the engine logged."""
    body = {
        "model": "glm",
        "messages": [{"role": "user", "content": "Name three rivers."}],
        "max_tokens": 8,
        "stream": True,
    }
    end = launched + READY_S
    ready_s = None
    while time.monotonic() < end:
        if proc.proc.poll() is not None:
            raise SystemExit(f"the engine exited with {proc.proc.returncode}:\n{proc.output()[-3000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=2).json().get("ok"):
                ready_s = time.monotonic() - launched
                break
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.1)
    if ready_s is None:
        raise SystemExit(f"the engine was not ready in {READY_S:.0f} s:\n{proc.output()[-3000:]}")
    first_s = None
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=120) as reply:
        for line in reply.iter_lines():
            if line.startswith("data:") and '"content"' in line:
                first_s = time.monotonic() - launched
                break
    line = next((x for x in proc.output().splitlines() if "ready in" in x and "start)" in x), "")
    return {"ready_s": round(ready_s, 2), "first_token_s": first_s and round(first_s, 2), "start_line": line}


def bench(url: str, out: Path, label: str, args: argparse.Namespace) -> int:
    command = [sys.executable, "-c", "from sparkfold.cli import main; main()", "bench", url]
    command += ["--suite", "fairness", "--no-progress", "--label", label, "--plot", str(out)]
    command += ["--fairness-streams", str(args.streams), "--fairness-interval", str(args.interval)]
    command += ["--fairness-tokens", str(args.tokens), "--max-tokens", "256", "--max-seconds", "300"]
    done = subprocess.run(command, env={**os.environ, **child_env()}, check=False, timeout=420)
    return done.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--context", type=int, default=1_048_576)
    parser.add_argument("--parallel", type=int, default=8)
    parser.add_argument("--chunks", default="2048", help="chunk_tokens values, comma-separated")
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--interval", type=float, default=0.25)
    parser.add_argument("--tokens", default="1m", help="the long prompt (capped by the window)")
    parser.add_argument("--control", action="store_true", help="a third start, empty caches again")
    parser.add_argument("--budget-s", type=float, default=540.0)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    work = Path(os.environ.get("WORK", "/tmp/sparkfold-gpu"))
    state = work / "fairness-state"
    shutil.rmtree(state, ignore_errors=True)
    chunks = [int(c) for c in args.chunks.split(",")]
    results: dict[str, Any] = {
        "model": str(args.model),
        "context": args.context,
        "starts": {},
        "fairness": {},
    }

    def save() -> None:
        (args.out / "restart.json").write_text(json.dumps(results, indent=2) + "\n")

    for name in ("first", "restart"):
        url, proc, launched = launch(
            args.model, args.out, name, state, args.context, chunks[0], args.parallel
        )
        try:
            results["starts"][name] = first_token(url, proc, launched)
            print(name, results["starts"][name], flush=True)
            save()
            if name == "restart":
                code = bench(url, args.out / f"fairness-c{chunks[0]}", f"chunk {chunks[0]}", args)
                results["fairness"][str(chunks[0])] = code
                save()
        finally:
            proc.stop()
    first, again = results["starts"]["first"], results["starts"]["restart"]
    if first["first_token_s"] and again["first_token_s"]:
        results["restart_speedup"] = round(first["first_token_s"] / again["first_token_s"], 2)
    for chunk in chunks[1:]:
        if time.monotonic() - began > args.budget_s - 150:
            results["fairness"][str(chunk)] = "skipped: time budget"
            continue
        url, proc, launched = launch(
            args.model, args.out, f"c{chunk}", state, args.context, chunk, args.parallel
        )
        try:
            first_token(url, proc, launched)
            results["fairness"][str(chunk)] = bench(
                url, args.out / f"fairness-c{chunk}", f"chunk {chunk}", args
            )
        finally:
            proc.stop()
        save()
    if args.control and time.monotonic() - began < args.budget_s - 150:
        fresh = work / "fairness-state-control"
        shutil.rmtree(fresh, ignore_errors=True)
        url, proc, launched = launch(
            args.model, args.out, "control", fresh, args.context, chunks[0], args.parallel
        )
        try:
            results["starts"]["control"] = first_token(url, proc, launched)
        finally:
            proc.stop()
    save()
    print(json.dumps(results, indent=2), flush=True)


if __name__ == "__main__":
    main()
