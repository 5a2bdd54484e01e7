"""Prompt reuse in the CPU engine: ``sparkfold bench --suite reuse`` against two ``sparkfold engine``
children on the tiny GLM-5.3-Flash, one with ``prefix_cache_tokens`` at its default and one with 0,
the runs interleaved (on, off, then off, on, …) so the machine's load falls on both alike.

Each run sends a prompt twice and two conversations that share a system prompt (both
``--tokens`` long, 8 reply tokens, thinking off); the rows keep both visits' TTFT and the cached
tokens the engine reported. Every run's JSON is written to ``OUT_DIR/round<N>-reuse-<on|off>.json``
and its rows printed as one JSON line.

    python -m tests.bench.cpu_prefix_reuse OUT_DIR [--rounds 4] [--tokens 1024]   # from the repository root
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
from pathlib import Path

from tests.integration.engine_procs import free_port, serving

from sparkfold.testing.tiny_glm import write_tiny_glm

KEEP = {"on": 8192, "off": 0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=1024)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    model = write_tiny_glm(args.out / "model")
    sparkfold = str(Path(sys.executable).with_name("sparkfold"))
    with contextlib.ExitStack() as stack:
        urls = {}
        for side, keep in KEEP.items():
            port = free_port()
            config = args.out / f"engine-{side}.toml"
            config.write_text(
                f'[node]\nrank = 0\n[engine]\nkind = "transformers"\nmodel = "{model}"\nserved_name = "glm"\n'
                f"port = {port}\ncontext = 8192\nmax_tokens = 256\nparallel = 1\nthinking = false\n"
                f"[engine.transformers]\nprefix_cache_tokens = {keep}\n"
            )
            urls[side] = stack.enter_context(serving(config, args.out / f"engine-{side}.log", port))
        for n in range(args.rounds):
            for side in ("on", "off") if n % 2 == 0 else ("off", "on"):
                saved = args.out / f"round{n}-reuse-{side}.json"
                tokens = str(args.tokens)
                subprocess.run(
                    [sparkfold, "bench", urls[side], "--suite", "reuse", "--reuse-tokens", tokens,
                     "--system-tokens", tokens, "--time-budget", "0", "--max-seconds", "600",
                     "--label", f"reuse-{side}", "--save", str(saved), "--no-progress"],
                    check=True,
                )  # fmt: skip
                rows = json.loads(saved.read_text())["suites"]["reuse"]["rows"]
                print(json.dumps({"round": n, "reuse": side, "rows": rows}), flush=True)


if __name__ == "__main__":
    main()
