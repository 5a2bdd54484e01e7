"""PNG plots of one bench run, or of several side by side (``sparkfold bench --compare``).

- ``decode.png``: aggregate tok/s, per-request tok/s and TTFT (p50, bar to p90) against
  concurrency; prose solid, structured dashed;
- ``prefill.png``: prefill tok/s and TTFT against prompt length;
- ``reuse.png``: TTFT of the first and the next visit, per reuse case (log scale);
- ``fairness.png``: without and with the long prompt, each decode gap (ms, at the delta that
  ended it) and each short request's TTFT (at its send time) over time, the measured window shaded.

Each run gets its own colour, so two runs drawn together compare at a glance. matplotlib is the
``bench`` extra (``pip install 'sparkfold[bench]'``), imported only here.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

__all__ = ["MissingMatplotlib", "draw"]

Run = tuple[str, dict[str, Any]]
_STYLE = {"prose": "-", "structured": "--"}


class MissingMatplotlib(RuntimeError):
    pass


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise MissingMatplotlib(
            "plots need matplotlib: pip install 'sparkfold[bench]' (or drop --plot)"
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _title(runs: list[Run], what: str) -> str:
    models = sorted({result["model"] for _, result in runs})
    return f"{what}: {', '.join(models)}"


def _finish(
    plt: Any, fig: Any, axes: Any, ylabels: tuple[str, ...], xlabel: str, title: str, path: Path
) -> None:
    """Label the panels (y from 0, light grid, the legend in the first), title, write, close."""
    for ax, ylabel in zip(axes, ylabels, strict=True):
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize="small")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _decode(plt: Any, runs: list[Run], path: Path) -> None:
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for colour, (label, result) in enumerate(runs):
        for kind, rows in result["suites"]["decode"]["levels"].items():
            xs = [r["concurrency"] for r in rows]
            style = dict(
                color=f"C{colour}", linestyle=_STYLE.get(kind, ":"), marker="o", label=f"{label} {kind}"
            )
            axes[0].plot(xs, [r["aggregate_tok_s"] for r in rows], **style)
            axes[1].plot(xs, [r["per_request_tok_s"] or float("nan") for r in rows], **style)
            p50 = [r["ttft_p50_ms"] if r["ttft_p50_ms"] is not None else float("nan") for r in rows]
            p90 = [r["ttft_p90_ms"] if r["ttft_p90_ms"] is not None else float("nan") for r in rows]
            axes[2].errorbar(
                xs,
                p50,
                yerr=[[0] * len(xs), [b - a for a, b in zip(p50, p90, strict=True)]],
                capsize=3,
                **style,
            )
    ylabels = ("aggregate tok/s", "per-request tok/s", "TTFT ms (p50, bar to p90)")
    _finish(plt, fig, axes, ylabels, "concurrent requests", _title(runs, "Decode"), path)


def _prefill(plt: Any, runs: list[Run], path: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for colour, (label, result) in enumerate(runs):
        rows = [r for r in result["suites"]["prefill"]["rows"] if "tok_s" in r]
        xs = [r.get("prompt_tokens") or r["target_tokens"] for r in rows]
        style = dict(color=f"C{colour}", marker="o", label=label)
        axes[0].plot(xs, [r["tok_s"] for r in rows], **style)
        axes[1].plot(xs, [r["ttft_s"] for r in rows], **style)
    for ax in axes:
        ax.set_xscale("log", base=2)
    _finish(plt, fig, axes, ("prefill tok/s", "TTFT s"), "prompt tokens", _title(runs, "Prefill"), path)


def _reuse(plt: Any, runs: list[Run], path: Path) -> None:
    cases = [row["prompt"] for row in runs[0][1]["suites"]["reuse"]["rows"]]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    width = 0.8 / (2 * len(runs))
    for colour, (label, result) in enumerate(runs):
        rows = {row["prompt"]: row for row in result["suites"]["reuse"]["rows"]}
        for visit, key in enumerate(("first_s", "next_s")):
            offset = (2 * colour + visit) * width - 0.4 + width / 2
            values = [rows.get(case, {}).get(key) or float("nan") for case in cases]
            ax.bar(
                [i + offset for i in range(len(cases))],
                values,
                width,
                color=f"C{colour}",
                alpha=1.0 if visit == 0 else 0.5,
                label=f"{label} {'first' if visit == 0 else 'next'}",
            )
    ax.set_xticks(range(len(cases)), [case.replace(", ", ",\n") for case in cases], fontsize="small")
    ax.set_yscale("log")
    ax.set_ylabel("TTFT s (log)")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize="small")
    fig.suptitle(_title(runs, "Prompt reuse"))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _fairness(plt: Any, runs: list[Run], path: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5), sharey=True)
    for ax, phase in zip(axes, ("baseline", "loaded"), strict=True):
        for colour, (label, result) in enumerate(runs):
            trace = result["suites"]["fairness"]["traces"][phase]
            xs, ys = [], []
            for times in trace["replies"]:
                for a, b in itertools.pairwise(times):
                    xs.append(b)
                    ys.append((b - a) * 1000)
            ax.scatter(xs, ys, s=6, color=f"C{colour}", alpha=0.6, label=f"{label} decode gaps")
            shorts = [(sent, (first - sent) * 1000) for sent, first in trace["shorts"] if first is not None]
            ax.scatter(
                [x for x, _ in shorts],
                [y for _, y in shorts],
                marker="x",
                s=30,
                color=f"C{colour}",
                label=f"{label} short TTFT",
            )
            ax.axvspan(0, trace["window_s"], color=f"C{colour}", alpha=0.08)
        ax.set_title("no long prompt" if phase == "baseline" else "a long prompt prefilling (shaded)")
    _finish(
        plt,
        fig,
        axes,
        ("ms (decode gap; short TTFT)", ""),
        "seconds from the window's start",
        _title(runs, "Fairness"),
        path,
    )


_PLOTS = {"decode": _decode, "prefill": _prefill, "reuse": _reuse, "fairness": _fairness}


def draw(runs: list[Run], out_dir: Path, prefix: str = "") -> list[Path]:
    """Write one PNG per plotted suite that every run has; the paths written."""
    plt = _pyplot()
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for suite, plot in _PLOTS.items():
        if all(suite in result["suites"] for _, result in runs):
            path = out_dir / f"{prefix}{suite}.png"
            plot(plt, runs, path)
            written.append(path)
    return written
