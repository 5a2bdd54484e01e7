"""The exllamav3 engine's start and its fairness on a GPU: the figures of docs/benchmarks.md.

1. **Restart.** ``sparkfold engine`` (kind exllamav3, engine core) on MODEL_DIR with an empty state
   directory (its compile caches empty: the first start on a fresh machine), then again with the
   same state directory (a restart): each from launching the process to the first streamed token
   of a request, with the start line's phases (load, warm-up, first token) and the
   ``first``/``restart`` label the engine gave it. With ``--control``, a third start with an
   empty state directory again (the weights now in the page cache: what the caches alone save).
2. **Fairness.** On the restarted engine, ``sparkfold bench --suite fairness`` (the real CLI) for
   each ``--chunks`` entry, ``CHUNK`` or ``CHUNK/SHARED`` (``[engine.exllamav3] chunk_tokens`` and
   ``shared_chunk_tokens``, the chunk of a prompt read while replies stream; the engine restarts in
   between), ``--repeats`` times: decoding streams and short requests, without and then with a long
   prompt, so each repeat pairs a baseline with the figures under the long prompt.
3. **Compiled after ready.** Each engine's compile caches are listed once it served its first
   request and again after its benchmarks: a file that appeared or grew is a kernel compiled (or a
   GEMM tuned) inside a request (``compiled_after_ready`` in ``restart.json``).
4. With ``--profile SPEC``, py-spy samples the engine (and its core, non-blocking) through that
   entry's last repeat: ``pyspy-<label>.txt`` and its summary, where a step's time goes.

Everything lands in OUT: ``restart.json``, one ``fairness-<label>/r<n>/`` folder per entry and
repeat (bench.md, bench.json, PNGs), the engines' logs. Bounded by ``--budget-s``: a step that
would start past it is skipped and says so.

    python tests/bench/exllamav3_fairness.py MODEL_DIR OUT [--chunks 2048,2048/512] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.bench.exllamav3_profile import summarize
from tests.gpu.gpu_engine import child_env
from tests.integration.engine_procs import EngineProcess, free_port, write_config

READY_S = 600.0


@dataclass(frozen=True)
class Spec:
    """One engine configuration: ``chunk_tokens`` and ``shared_chunk_tokens`` (0: the chunk)."""

    chunk: int
    shared: int = 0

    @classmethod
    def parse(cls, text: str) -> Spec:
        chunk, _, shared = text.partition("/")
        return cls(int(chunk), int(shared or 0))

    @property
    def label(self) -> str:
        return f"c{self.chunk}" + (f"-s{self.shared}" if self.shared else "")

    def toml(self) -> str:
        return f"chunk_tokens = {self.chunk}\nshared_chunk_tokens = {self.shared}\n"


def cache_files(state: Path) -> dict[str, int]:
    """The engine's compile caches: each file's size."""
    caches = state / "cache" / "compile-cache"
    return {str(p.relative_to(caches)): p.stat().st_size for p in caches.rglob("*") if p.is_file()}


def grown(before: dict[str, int], after: dict[str, int]) -> list[str]:
    return sorted(name for name, size in after.items() if before.get(name) != size)


def launch(
    model: Path, out: Path, name: str, state: Path, context: int, spec: Spec, parallel: int
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
    config.write_text(config.read_text() + "[engine.exllamav3]\n" + spec.toml() + paths)
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


def pyspy(pid: int, out: Path) -> subprocess.Popen[bytes]:
    """py-spy over the engine and its core (``--subprocesses``), every thread, without pausing them;
    stopped with SIGINT, it writes what it sampled."""
    spy = shutil.which("py-spy") or "py-spy"
    args = [spy, "record", "--pid", str(pid), "--subprocesses", "--threads", "--idle", "--nonblocking"]
    args += ["--rate", "100", "--duration", "600", "--format", "raw", "--output", str(out)]
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)


def benches(
    url: str, proc: EngineProcess, spec: Spec, state: Path, args: argparse.Namespace, results: dict[str, Any]
) -> None:
    """``--repeats`` fairness runs on the ready engine (py-spy over the last one when ``--profile``
    names ``spec``), then what its requests compiled."""
    ready = cache_files(state)
    runs = []
    for repeat in range(1, args.repeats + 1):
        spy = None
        if repeat == args.repeats and args.profile == spec:
            spy = pyspy(proc.proc.pid, args.out / f"pyspy-{spec.label}.txt")
            time.sleep(1.0)  # py-spy attaching
        runs.append(bench(url, args.out / f"fairness-{spec.label}" / f"r{repeat}", spec.label, args))
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(timeout=60)
    results["fairness"][spec.label] = runs
    results["compiled_after_ready"][spec.label] = grown(ready, cache_files(state))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--context", type=int, default=1_048_576)
    parser.add_argument("--parallel", type=int, default=8)
    parser.add_argument("--chunks", default="2048", help="CHUNK or CHUNK/SHARED entries, comma-separated")
    parser.add_argument("--repeats", type=int, default=1, help="fairness runs per entry")
    parser.add_argument("--profile", type=Spec.parse, default=None, help="py-spy over this entry's last run")
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
    specs = [Spec.parse(entry) for entry in args.chunks.split(",")]
    results: dict[str, Any] = {
        "model": str(args.model),
        "context": args.context,
        "starts": {},
        "fairness": {},
        "compiled_after_ready": {},
    }

    def save() -> None:
        (args.out / "restart.json").write_text(json.dumps(results, indent=2) + "\n")

    for name in ("first", "restart"):
        url, proc, launched = launch(args.model, args.out, name, state, args.context, specs[0], args.parallel)
        try:
            results["starts"][name] = first_token(url, proc, launched)
            print(name, results["starts"][name], flush=True)
            save()
            if name == "restart":
                benches(url, proc, specs[0], state, args, results)
                save()
        finally:
            proc.stop()
    first, again = results["starts"]["first"], results["starts"]["restart"]
    if first["first_token_s"] and again["first_token_s"]:
        results["restart_speedup"] = round(first["first_token_s"] / again["first_token_s"], 2)
    for spec in specs[1:]:
        if time.monotonic() - began > args.budget_s - 60 - 60 * args.repeats:
            results["fairness"][spec.label] = "skipped: time budget"
            continue
        url, proc, launched = launch(
            args.model, args.out, spec.label, state, args.context, spec, args.parallel
        )
        try:
            results["starts"][spec.label] = first_token(url, proc, launched)
            benches(url, proc, spec, state, args, results)
        finally:
            proc.stop()
        save()
    if args.control and time.monotonic() - began < args.budget_s - 150:
        fresh = work / "fairness-state-control"
        shutil.rmtree(fresh, ignore_errors=True)
        url, proc, launched = launch(
            args.model, args.out, "control", fresh, args.context, specs[0], args.parallel
        )
        try:
            results["starts"]["control"] = first_token(url, proc, launched)
        finally:
            proc.stop()
    if any(args.out.glob("pyspy-*.txt")):
        (args.out / "pyspy-summary.json").write_text(json.dumps(summarize(args.out), indent=2) + "\n")
    save()
    print(json.dumps(results, indent=2), flush=True)


if __name__ == "__main__":
    main()
