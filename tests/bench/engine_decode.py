"""Engine decode speed: the engine server against plain ``model.generate``; tp=2 against tp=1.

Everything is measured in one run on one machine, so the ratios hold even where the absolute
numbers do not travel. Decode tok/s = (tokens - 1) / (time of last token - time of first token):
the prompt's prefill is left out on both sides.

- baseline: ``model.generate`` greedy in this process (``--threads`` torch threads);
- server tp=1: ``sparkfold engine`` as a child process with the same threads, streamed through HTTP
  (the client clock, so the server's overheads count);
- server tp=2: two ranks on loopback (127.0.0.1 and 127.0.0.2), each with ``--threads``.

Setups are loaded together and measured round-robin, so load from other work on the machine hits
each alike; tok/CPU-second (the engine processes' user + system time) is reported too, as it is
far less sensitive to such load than the wall clock.

Run: ``python tests/bench/engine_decode.py [--model DIR] [--tokens 64] [--repeats 5] [--json]``
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx

from sparkfold.engines.models import export_hf_dir, resolve_model

__all__ = ["main", "measure"]

PROMPT = "Write a short story about a lighthouse keeper."
READY_DEADLINE_S = 300


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _cpu_s(pids: list[int]) -> float:
    """CPU seconds (user + system) the processes used so far."""
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


@dataclass
class Sample:
    """One measured reply: decode tok/s on the wall clock and per CPU-second."""

    wall_tok_s: float
    cpu_tok_s: float


class Baseline:
    """Plain ``model.generate`` in this process."""

    def __init__(self, model_dir: Path, prompt: list[int], threads: int) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(threads)
        self._torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.ids = torch.tensor([prompt])

    def _timed(self, n: int) -> tuple[float, float]:
        wall, cpu = time.perf_counter(), time.process_time()
        with self._torch.inference_mode():
            self.model.generate(self.ids, max_new_tokens=n, min_new_tokens=n, do_sample=False)
        return time.perf_counter() - wall, time.process_time() - cpu

    def sample(self, tokens: int) -> Sample:
        wall1, cpu1 = self._timed(1)  # prefill + first token
        wall, cpu = self._timed(tokens)
        return Sample((tokens - 1) / (wall - wall1), (tokens - 1) / (cpu - cpu1))


def _config(
    path: Path, model_dir: Path, port: int, threads: int, rank: int = 0, tp: int = 1, rendezvous: int = 0
) -> Path:
    lines = [
        "[node]",
        f"rank = {rank}",
        "[engine]",
        'kind = "transformers"',
        f'model = "{model_dir}"',
        'served_name = "bench"',
        f"tp = {tp}",
        f"port = {port}",
        "context = 2048",
        "max_tokens = 512",
        "parallel = 1",
        "[engine.transformers]",
        f"threads = {threads}",
    ]
    if tp == 2:
        me, peer = ("127.0.0.1", "127.0.0.2") if rank == 0 else ("127.0.0.2", "127.0.0.1")
        lines += [
            "[fabric]",
            f'address = "{me}"',
            f'peer = "{peer}"',
            f"rendezvous_port = {rendezvous}",
            "peer_timeout_s = 60",
        ]
    path.write_text("\n".join(lines) + "\n")
    return path


@contextmanager
def _engine(model_dir: Path, threads: int, tp: int, workdir: Path) -> Iterator[tuple[str, list[int]]]:
    port, rendezvous = _free_port(), _free_port()
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    env.pop("NOTIFY_SOCKET", None)
    procs = []
    for rank in reversed(range(tp)):
        config = _config(workdir / f"tp{tp}-rank{rank}.toml", model_dir, port, threads, rank, tp, rendezvous)
        log = (workdir / f"tp{tp}-rank{rank}.log").open("wb")
        command = [
            sys.executable,
            "-c",
            "from sparkfold.cli import main; main()",
            "engine",
            "--config",
            str(config),
        ]
        procs.append(subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT))
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + READY_DEADLINE_S
        while True:
            if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
                raise RuntimeError(f"engine tp={tp} did not start; see {workdir}")
            try:
                if httpx.get(f"{url}/health", timeout=2).json().get("ok"):
                    break
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.2)
        yield url, [p.pid for p in procs]
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def _stream(url: str, prompt: list[int], tokens: int) -> tuple[float, int]:
    """Stream one reply; (seconds from first to last token, tokens)."""
    body = {"prompt": prompt, "max_tokens": tokens, "temperature": 0, "ignore_eos": True, "stream": True}
    first = last = 0.0
    count = 0
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=600) as reply:
        reply.raise_for_status()
        for line in reply.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(f"engine error: {chunk['error']}")
            now = time.perf_counter()
            if chunk.get("usage"):
                count, last = chunk["usage"]["completion_tokens"], now
            elif first == 0.0:
                first = now
    return last - first, count


def _served(url: str, pids: list[int], prompt: list[int], tokens: int) -> Sample:
    cpu = _cpu_s(pids)
    _stream(url, prompt, 1)
    cpu1 = _cpu_s(pids) - cpu
    cpu = _cpu_s(pids)
    seconds, count = _stream(url, prompt, tokens)
    cpu_n = _cpu_s(pids) - cpu
    return Sample((count - 1) / seconds, (count - 1) / max(cpu_n - cpu1, 1e-9))


def measure(model: str | None, tokens: int, repeats: int, threads: int) -> dict[str, Any]:
    """All setups loaded at once, then measured round-robin (so load from elsewhere hits each alike)."""
    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory(prefix="sparkfold-bench-") as tmp, ExitStack() as stack:
        workdir = Path(tmp)
        model_dir = Path(model) if model else export_hf_dir(resolve_model("smollm2"), workdir / "smollm2-hf")
        prompt = list(AutoTokenizer.from_pretrained(model_dir).encode(PROMPT))
        baseline = Baseline(model_dir, prompt, threads)
        servers = {
            f"server_tp{tp}": stack.enter_context(_engine(model_dir, threads, tp, workdir)) for tp in (1, 2)
        }
        setups: dict[str, Callable[[], Sample]] = {"generate": lambda: baseline.sample(tokens)}
        for name, (url, pids) in servers.items():
            setups[name] = partial(_served, url, pids, prompt, tokens)
        for run in setups.values():  # warm-up
            run()
        samples: dict[str, list[Sample]] = {name: [] for name in setups}
        for _ in range(repeats):
            for name, run in setups.items():
                samples[name].append(run())
    wall = {name: statistics.median(s.wall_tok_s for s in runs) for name, runs in samples.items()}
    cpu = {name: statistics.median(s.cpu_tok_s for s in runs) for name, runs in samples.items()}
    return {
        "model": model or "smollm2 (SmolLM2-135M-Instruct Q4_1, de-quantized to float32)",
        "tokens": tokens,
        "repeats": repeats,
        "threads_per_process": threads,
        "cpus": os.cpu_count(),
        "load_average": round(os.getloadavg()[0], 2),
        "decode_tok_s": {name: round(value, 2) for name, value in wall.items()},
        "decode_tok_per_cpu_s": {name: round(value, 2) for name, value in cpu.items()},
        "runs_tok_s": {name: [round(s.wall_tok_s, 2) for s in runs] for name, runs in samples.items()},
        "server_vs_generate": round(wall["server_tp1"] / wall["generate"], 3),
        "server_vs_generate_cpu": round(cpu["server_tp1"] / cpu["generate"], 3),
        "tp2_vs_tp1": round(wall["server_tp2"] / wall["server_tp1"], 3),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="HF model directory (default: the smollm2 demo model, converted)")
    parser.add_argument("--tokens", type=int, default=64, help="tokens per reply")
    parser.add_argument("--repeats", type=int, default=5, help="measured replies per setup (median)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args(argv)
    result = measure(args.model, args.tokens, args.repeats, args.threads)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(
        f"decode tok/s, {result['tokens']} tokens, median of {result['repeats']}, "
        f"{result['threads_per_process']} torch thread(s) per process, {result['cpus']} CPUs"
    )
    for name, value in result["decode_tok_s"].items():
        per_cpu = result["decode_tok_per_cpu_s"][name]
        print(f"  {name:12} {value:8.2f} tok/s  {per_cpu:8.2f} tok/CPU-s   runs {result['runs_tok_s'][name]}")
    print(
        f"  server / generate  {result['server_vs_generate']:.3f} (wall)  "
        f"{result['server_vs_generate_cpu']:.3f} (per CPU-second)"
    )
    print(f"  tp=2 / tp=1        {result['tp2_vs_tp1']:.3f}")


if __name__ == "__main__":
    main()
