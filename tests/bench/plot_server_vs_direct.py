"""Draw server-vs-direct runs (the JSON ``exllamav3_bench.py --json`` writes) as one PNG: tok/s of
both sides against concurrency (median, bars to the lowest and highest round), one colour per run.

    python tests/bench/plot_server_vs_direct.py OUT.png RUN1.json [RUN2.json …]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def main() -> None:
    out, *runs = (Path(a) for a in sys.argv[1:])
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for colour, path in enumerate(runs):
        rows = json.loads(path.read_text())["levels"]
        xs = [r["concurrent"] for r in rows]
        for side, style in (("direct", "--"), ("server", "-")):
            mid = [r[side]["tok_s"] for r in rows]
            low = [m - r[side]["tok_s_min"] for m, r in zip(mid, rows, strict=True)]
            high = [r[side]["tok_s_max"] - m for m, r in zip(mid, rows, strict=True)]
            axes[0].errorbar(
                xs,
                mid,
                yerr=[low, high],
                capsize=3,
                color=f"C{colour}",
                linestyle=style,
                marker="o",
                label=f"{path.stem} {side}",
            )
        ratio = [r["ratio"] for r in rows]
        spread = [
            [a - r["ratio_min"] for a, r in zip(ratio, rows, strict=True)],
            [r["ratio_max"] - a for a, r in zip(ratio, rows, strict=True)],
        ]
        axes[1].errorbar(xs, ratio, yerr=spread, capsize=3, color=f"C{colour}", marker="o", label=path.stem)
    axes[1].axhline(0.95, color="grey", linestyle=":", label="target 0.95")
    for ax, label in zip(
        axes, ("tok/s (median; bars: lowest–highest round)", "server / direct"), strict=True
    ):
        ax.set_xlabel("concurrent requests")
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    fig.suptitle("exllamav3 engine server vs exllamav3's own loop, H200, bench-size fixture")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main()
