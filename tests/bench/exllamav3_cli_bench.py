"""``sparkfold bench`` against the exllamav3 engine server on a GPU: the recipe-shaped tables and
plots for docs/benchmarks.md.

Starts ``sparkfold engine`` (kind exllamav3) on MODEL_DIR with a window big enough for the reuse
suite's long prompt, then runs the real CLI against it; everything after ``--`` goes to
``sparkfold bench`` (default ``--suite decode,reuse``). bench.md, bench.json and the PNGs land in
OUT (without matplotlib on the GPU host, bench.md and bench.json are still written and the
command exits non-zero; ``sparkfold.bench.plots.draw`` draws the JSON elsewhere).

    python tests/bench/exllamav3_cli_bench.py MODEL_DIR OUT [--context 81920] [-- BENCH_ARGS…]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.bench.exllamav3_bench import serve
from tests.gpu.gpu_engine import child_env

DEFAULT_BENCH = ["--suite", "decode,reuse", "--label", "exllamav3 server"]


def split_at_dashes(argv: list[str]) -> tuple[list[str], list[str]]:
    """This script's arguments and, after the first ``--``, those for ``sparkfold bench`` (argparse
    takes no options after a ``--`` once the positionals are filled)."""
    if "--" not in argv:
        return argv, []
    at = argv.index("--")
    return argv[:at], argv[at + 1 :]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--context", type=int, default=81_920, help="the engine's window (reuse sends 64k)")
    parser.add_argument("--max-tokens", type=int, default=512, help="the engine's reply cap")
    own, bench = split_at_dashes(sys.argv[1:])
    args = parser.parse_args(own)
    args.out.mkdir(parents=True, exist_ok=True)
    engine = serve(args.model, args.out, "cli-bench", max_tokens=args.max_tokens, context=args.context)
    with engine as (url, _):
        command = [sys.executable, "-c", "from sparkfold.cli import main; main()", "bench", url]
        command += [*(bench or DEFAULT_BENCH), "--no-progress", "--plot", str(args.out)]
        done = subprocess.run(command, env={**os.environ, **child_env()}, check=False)
    raise SystemExit(done.returncode)


if __name__ == "__main__":
    main()
