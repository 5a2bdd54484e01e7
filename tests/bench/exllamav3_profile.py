"""Where the exllamav3 engine's step time goes, on the GPU: the direct loop's GPU-busy share, and
the engine server's threads under load.

1. Direct loop (exllamav3's generator in this process, as in ``exllamav3_bench.py``): one round
   per concurrency under ``torch.profiler`` (CPU and CUDA activity): GPU-busy share = the sum of
   the CUDA kernels' time / the round's wall time, and the wall time per step; the same round
   without the profiler gives the undisturbed step time.
2. Engine server (``sparkfold engine``, kind exllamav3, in a child process): rounds of streamed
   requests at each concurrency while ``py-spy`` samples the child (non-blocking, so it does not
   pause it), once with ``--idle`` (every thread's stack, idle or not: where each thread's time
   goes) and once with ``--gil`` (only the thread holding the GIL: who has the interpreter), and
   with ``--modes native`` also with native frames (C++/CUDA: where the GIL-free time goes). The
   collapsed stacks land in OUT as ``pyspy-{mode}-{level}.txt``; ``summarize`` prints, per
   thread, its share of samples and its top leaf frames.

    python tests/bench/exllamav3_profile.py MODEL_DIR OUT [--levels 1,8] [--tokens 128]
    python tests/bench/exllamav3_profile.py --summarize OUT     # read the stacks again
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.bench.exllamav3_bench import Direct, serve
from tests.bench.server_vs_direct import prompts, server_round

SAMPLE_RATE = 200  # py-spy samples per second


def gpu_busy(direct: Direct, level: int, tokens: int) -> dict[str, float]:
    """The direct loop's GPU-busy share at ``level`` concurrent jobs, and its step times."""
    torch = direct.torch
    from torch.profiler import ProfilerActivity, profile

    direct.round(prompts(level, f"warm-p{level}"), 16)
    plain = direct.round(prompts(level, f"plain-{level}"), tokens)
    tokens = min(tokens, 32)  # the profiled round: kernel events only, a few dozen steps
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:  # CPU events: too many to keep
        started = time.perf_counter()
        direct.round(prompts(level, f"prof-{level}"), tokens)
        torch.cuda.synchronize()
        wall = time.perf_counter() - started
    kernels_us = sum(
        event.self_device_time_total
        for event in prof.key_averages()
        if str(getattr(event, "device_type", "")).endswith("CUDA")
    )
    return {
        "level": level,
        "tokens": tokens,
        "step_ms": 1000 * level / plain["tok_s"],  # tokens × level generated in tokens steps
        "step_ms_profiled": 1000 * wall / tokens,
        "gpu_busy_share": kernels_us / 1e6 / wall,
        "gpu_ms_per_step": kernels_us / 1000 / tokens,
    }


MODES = {
    "idle": ["--nonblocking", "--idle"],  # every thread, idle or not
    "gil": ["--nonblocking", "--gil"],  # only the thread holding the GIL
    "native": ["--native", "--idle"],  # C/C++/CUDA frames too (py-spy pauses the process to read them)
}


def _pyspy(pid: int, mode: str, out: Path, seconds: float) -> subprocess.Popen[bytes]:
    spy = shutil.which("py-spy") or "py-spy"
    rate = SAMPLE_RATE // 4 if mode == "native" else SAMPLE_RATE
    args = [spy, "record", "--pid", str(pid), "--threads", *MODES[mode], "--rate", str(rate)]
    args += ["--duration", str(int(seconds)), "--format", "raw", "--output", str(out)]
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)


def server_profile(
    model_dir: Path, out: Path, levels: list[int], tokens: int, modes: list[str]
) -> list[dict[str, Any]]:
    rows = []
    # The engine in the server's process (``plain``): py-spy sees the engine thread and HTTP at once.
    with serve(model_dir, out, "profile", max_tokens=tokens, server="plain") as (url, proc):
        for level in levels:
            asyncio.run(server_round(url, prompts(level, f"warm-{level}"), 16))
            timed = asyncio.run(server_round(url, prompts(level, f"t-{level}"), tokens))
            for mode in modes:
                seconds = max(3.0, timed["wall_s"] * 2 + 1)
                spy = _pyspy(proc.proc.pid, mode, out / f"pyspy-{mode}-{level}.txt", seconds)
                time.sleep(0.5)  # py-spy attaching: it reads the process from outside, nothing to await
                deadline = time.perf_counter() + seconds - 1.0
                served = []
                while time.perf_counter() < deadline:
                    served.append(
                        asyncio.run(
                            server_round(url, prompts(level, f"{mode}-{level}-{len(served)}"), tokens)
                        )
                    )
                spy.wait(timeout=seconds + 60)
                rows.append({"level": level, "mode": mode, "rounds": served})
    return rows


def summarize(out: Path) -> dict[str, Any]:
    """Per file: each thread's share of the samples, its heaviest frames of ours (sparkfold,
    exllamav3) and its heaviest leaf frames (native ones with ``--native``)."""
    report: dict[str, Any] = {}
    for path in sorted(out.glob("pyspy-*.txt")):
        threads: collections.Counter[str] = collections.Counter()
        leaves: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        raw: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        total = 0
        for line in path.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            if not stack or not count.isdigit():
                continue
            frames = stack.split(";")
            thread = frames[0]
            n = int(count)
            total += n
            threads[thread] += n
            ours = [f for f in frames[1:] if "sparkfold" in f or "exllamav3" in f]
            leaves[thread][(ours[-1] if ours else frames[-1])[:140]] += n
            raw[thread][frames[-1][:140]] += n
        report[path.name] = {
            "samples": total,
            "threads": {
                t: {
                    "share": round(n / total, 3),
                    "top": leaves[t].most_common(6),
                    "leaf": raw[t].most_common(6),
                }
                for t, n in threads.most_common(6)
            },
        }
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path, nargs="?")
    parser.add_argument("out", type=Path)
    parser.add_argument("--levels", default="1,8")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--summarize", action="store_true", help="only summarize the stacks in OUT")
    parser.add_argument("--modes", default="idle,gil", help=f"py-spy modes, of {','.join(MODES)}")
    parser.add_argument("--server-only", action="store_true", help="skip the direct loop's GPU-busy share")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.summarize:
        levels = [int(n) for n in args.levels.split(",")]
        if not args.server_only:
            direct = Direct(args.model)
            busy = [gpu_busy(direct, level, args.tokens) for level in levels]
            print(json.dumps(busy, indent=2), flush=True)
            (args.out / "gpu-busy.json").write_text(json.dumps(busy, indent=2) + "\n")
            direct.close()
        rows = server_profile(args.model, args.out, levels, args.tokens, args.modes.split(","))
        (args.out / "server-rounds.json").write_text(json.dumps(rows, indent=2) + "\n")
    summary = summarize(args.out)
    (args.out / "pyspy-summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
