"""``sparkfold bench URL``: the recipe's tables for any endpoint, as markdown, JSON and PNG plots."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import httpx

from sparkfold.commands._options import bounded_option, echo_json, json_option

_K = {"k": 1_024, "m": 1_048_576}


def _numbers(text: str, what: str, low: int, high: int) -> tuple[int, ...]:
    numbers = []
    for part in (p.strip().lower() for p in text.split(",") if p.strip()):
        scale = _K.get(part[-1], 1)
        try:
            numbers.append(int(float(part[:-1] if scale > 1 else part) * scale))
        except ValueError:
            raise click.BadParameter(f"a comma-separated list of {what}, e.g. {low},{low * 4}") from None
    if not numbers or min(numbers) < low or max(numbers) > high:
        raise click.BadParameter(f"each value must be between {low:,} and {high:,}")
    return tuple(numbers)


def _levels(ctx: click.Context, param: click.Parameter, value: str) -> tuple[int, ...]:
    return _numbers(value, "whole numbers", 1, 256)


def _lengths(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[int, ...] | None:
    return None if value is None else _numbers(value, "token counts (8k = 8192)", 16, 1 << 24)


def _tokens(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    return None if value is None else _numbers(value, "token counts (1m = 1048576)", 64, 1 << 24)[0]


def _suites(ctx: click.Context, param: click.Parameter, value: str) -> list[str]:
    from sparkfold.bench.suites import SUITES

    chosen = [part.strip() for part in value.split(",") if part.strip()]
    unknown = [name for name in chosen if name not in SUITES]
    if unknown or not chosen:
        raise click.BadParameter(
            f"choose from {', '.join(SUITES)} (comma-separated), not {', '.join(unknown)}"
        )
    return chosen


def _load(path: Path) -> tuple[str, dict[str, Any]]:
    from sparkfold.bench.run import FORMAT

    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise click.ClickException(f"{path}: not a readable JSON file ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise click.ClickException(f"{path}: not a sparkfold bench result (want format {FORMAT})")
    return str(data.get("label") or path.stem), data


def _plot(runs: list[tuple[str, dict[str, Any]]], out: Path, prefix: str = "") -> None:
    from sparkfold.bench.plots import MissingMatplotlib, draw

    try:
        for path in draw(runs, out, prefix):
            click.echo(f"wrote {path}", err=True)
    except MissingMatplotlib as exc:
        raise click.ClickException(str(exc)) from None


_SIZED = {
    "levels": "levels",
    "rounds": "rounds",
    "warmup": "warmup",
    "max_tokens": "max_tokens",
    "prefill_lengths": "prefill_lengths",
    "reuse_tokens": "reuse_tokens",
    "system_tokens": "system_tokens",
}
"""Parameters a time budget may size (click name: knob), unless given on the command line."""


def _set_by_user(ctx: click.Context) -> frozenset[str]:
    return frozenset(
        knob
        for name, knob in _SIZED.items()
        if ctx.get_parameter_source(name) not in (click.core.ParameterSource.DEFAULT, None)
    )


@click.command()
@click.argument("url", required=False)
@click.option(
    "--suite",
    "suites",
    default="decode,prefill,reuse,exact",
    show_default=True,
    callback=_suites,
    help="Suites to run, in order: decode, prefill, reuse, exact, fairness.",
)
@click.option(
    "--concurrency",
    "levels",
    metavar="N[,N…]",
    default="1,4,8",
    show_default=True,
    callback=_levels,
    help="decode: streams open at once, one level after the other.",
)
@bounded_option("--rounds", 2, 1, 100, "decode: requests per stream and level (level × N requests).")
@bounded_option(
    "--warmup", 1, 0, 100, "decode: unmeasured requests per stream before each level's measured ones."
)
@bounded_option("--max-tokens", 256, 1, 1 << 20, "decode: reply budget per request.")
@click.option(
    "--prefill-lengths",
    metavar="N[,N…]",
    default=None,
    callback=_lengths,
    help="prefill: prompt lengths in tokens (8k, 32k, …) [default: 8k doubling up to the window].",
)
@bounded_option(
    "--window",
    None,
    64,
    1 << 24,
    "The context window [default: the endpoint's max_model_len, else 32k].",
    metavar="TOKENS",
)
@bounded_option(
    "--reuse-tokens", 65_536, 16, 1 << 24, "reuse: the long prompt sent twice (capped by the window)."
)
@bounded_option(
    "--system-tokens",
    7_900,
    16,
    1 << 24,
    "reuse: the system prompt two conversations share (capped at half the window).",
)
@bounded_option("--exact-requests", 4, 2, 64, "exact: replies compared, serial against concurrent.")
@bounded_option("--fairness-streams", 2, 1, 256, "fairness: streams decoding while the long prompt is read.")
@bounded_option(
    "--fairness-interval", 0.5, 0.05, 3600, "fairness: seconds between short requests.", metavar="S"
)
@click.option(
    "--fairness-tokens",
    metavar="N",
    default=None,
    callback=_tokens,
    help="fairness: the long prompt in tokens (1m = 1048576) [default: the window, or what a fourth of "
    "the phase's deadline allows at a first prompt's prefill rate].",
)
@bounded_option(
    "--fairness-baseline", 10.0, 1, 3600, "fairness: seconds measured without the long prompt.", metavar="S"
)
@bounded_option("--max-seconds", 900.0, 1, 86_400, "Time limit per phase (and per request).", metavar="S")
@bounded_option(
    "--time-budget",
    480.0,
    0,
    86_400,
    "Size the decode and exact knobs you leave unset by a first measured request so the run takes "
    "about this long (each phase's deadline a share of it); 0: the recipe's sizes as listed.",
    metavar="S",
)
@click.option("--model", metavar="ID", default=None, help="Model id (default: the first listed).")
@click.option(
    "--api-key",
    metavar="KEY",
    envvar="SPARKFOLD_API_KEY",
    default=None,
    help="Bearer key (the gateway, a router).",
)
@click.option("--label", metavar="TEXT", default=None, help="This run's name in plots and comparisons.")
@click.option(
    "--save",
    "save_path",
    metavar="FILE",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the run's JSON here.",
)
@click.option(
    "--plot",
    "plot_dir",
    metavar="DIR",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Write bench.md, bench.json and PNG plots into DIR.",
)
@click.option(
    "--compare",
    "compare",
    nargs=2,
    metavar="A.json B.json",
    default=None,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Draw two saved runs side by side (into --plot DIR, default .) instead of running.",
)
@click.option(
    "--progress/--no-progress", default=None, help="Progress bars [default: when stderr is a terminal]."
)
@json_option
def command(
    url: str | None,
    suites: list[str],
    levels: tuple[int, ...],
    rounds: int,
    warmup: int,
    max_tokens: int,
    prefill_lengths: tuple[int, ...] | None,
    window: int | None,
    reuse_tokens: int,
    system_tokens: int,
    exact_requests: int,
    fairness_streams: int,
    fairness_interval: float,
    fairness_tokens: int | None,
    fairness_baseline: float,
    max_seconds: float,
    time_budget: float,
    model: str | None,
    api_key: str | None,
    label: str | None,
    save_path: Path | None,
    plot_dir: Path | None,
    compare: tuple[Path, Path] | None,
    progress: bool | None,
    as_json: bool,
) -> None:
    """Measure URL (the gateway, an engine server or a router) as the recipe does, or --compare two runs."""
    from sparkfold.bench.report import comparison, markdown

    if compare:
        runs = [_load(path) for path in compare]
        _plot(runs, plot_dir or Path("."), prefix="compare-")
        click.echo(comparison(runs))
        return
    if url is None:
        raise click.UsageError("give the endpoint's URL (or --compare A.json B.json)")
    from sparkfold.bench.run import run, total_errors
    from sparkfold.bench.suites import Knobs

    knobs = Knobs(
        levels=levels,
        rounds=rounds,
        warmup=warmup,
        max_tokens=max_tokens,
        prefill_lengths=prefill_lengths,
        window=window,
        reuse_tokens=reuse_tokens,
        system_tokens=system_tokens,
        exact_requests=exact_requests,
        fairness_streams=fairness_streams,
        fairness_interval_s=fairness_interval,
        fairness_tokens=fairness_tokens,
        fairness_baseline_s=fairness_baseline,
        max_seconds=max_seconds,
        budget_s=time_budget,
        fixed=_set_by_user(click.get_current_context()),
        **({} if progress is None else {"progress": progress}),
    )

    def keep(result: dict[str, Any]) -> None:
        """Write what is measured so far (after every suite): a run cut short keeps it."""
        if label:
            result["label"] = label
        text = json.dumps(result, indent=2) + "\n"
        if save_path:
            save_path.write_text(text)
        if plot_dir:
            plot_dir.mkdir(parents=True, exist_ok=True)
            (plot_dir / "bench.json").write_text(text)
            (plot_dir / "bench.md").write_text(markdown(result))

    try:
        note = (lambda line: None) if as_json else (lambda line: click.echo(f"bench: {line}", err=True))
        result = run(url, suites, knobs, api_key=api_key, model=model, on_suite=keep, on_note=note)
    except (httpx.HTTPError, LookupError) as exc:
        raise click.ClickException(f"{url}: {exc}") from None
    keep(result)
    if plot_dir:
        _plot([(label or "run", result)], plot_dir)
    if as_json:
        echo_json(result)
    else:
        click.echo(markdown(result))
    if total_errors(result):
        raise SystemExit(1)
