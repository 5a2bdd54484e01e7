"""``sparkfold eval URL``: quality checks against any endpoint (HumanEval offline, harnesses if connected)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import httpx

from sparkfold.bench.client import reply_budget
from sparkfold.commands._options import bounded_option, echo_json, json_option

SUITES = ("humaneval", "gsm8k", "humaneval+", "mbpp+")
# the reference recipe's settings: GSM8K and HumanEval thinking off, HumanEval+ / MBPP+ thinking on
RECIPE_THINKING = {"humaneval": False, "gsm8k": False, "humaneval+": True, "mbpp+": True}


def _suites(ctx: click.Context, param: click.Parameter, value: str) -> list[str]:
    chosen = [part.strip().lower() for part in value.split(",") if part.strip()]
    unknown = [name for name in chosen if name not in SUITES]
    if unknown or not chosen:
        raise click.BadParameter(
            f"choose from {', '.join(SUITES)} (comma-separated), not {', '.join(unknown)}"
        )
    return chosen


def _humaneval(url: str, thinking: bool, options: dict[str, Any]) -> dict[str, Any]:
    from sparkfold.evals import humaneval

    try:
        return humaneval.run(url, thinking=thinking, **options)
    except humaneval.MissingHumanEval as exc:
        raise click.ClickException(str(exc)) from None


def _harness(
    suite: str, url: str, thinking: bool, dry_run: bool, out_dir: Path, options: dict[str, Any]
) -> int:
    from sparkfold.evals.harnesses import command_for

    model, window = options["model"], None
    try:
        listed = httpx.get(url.rstrip("/") + "/v1/models", timeout=30, trust_env=False).raise_for_status()
        cards = listed.json()["data"]
        card = next(c for c in cards if model is None or c["id"] == model)
        model, window = card["id"], card.get("max_model_len")
    except (httpx.HTTPError, ValueError, KeyError, StopIteration) as exc:
        if model is None:
            raise click.ClickException(f"{url}: cannot list the served model ({exc}); pass --model") from None
    harness = command_for(
        suite,
        url,
        model,
        api_key=options["api_key"],
        limit=options["limit"],
        max_tokens=reply_budget(suite, model, window, options["max_tokens"]),
        thinking=thinking,
        concurrency=options["concurrency"],
        out_dir=str(out_dir / suite),
    )
    click.echo("$ " + " ".join(harness.argv), err=True)
    if dry_run:
        return 0
    if not harness.available():
        raise click.ClickException(
            f"{suite} runs {harness.executable}, which is not installed here: {harness.install} "
            "(it downloads its data set at run time, so run it where the network reaches it)"
        )
    return harness.run()


@click.command()
@click.argument("url")
@click.option(
    "--suite",
    "suites",
    default="humaneval",
    show_default=True,
    callback=_suites,
    help="humaneval (offline, bundled), gsm8k (lm-eval), humaneval+ and mbpp+ (EvalPlus).",
)
@bounded_option("--limit", None, 1, None, "Only the first N problems (CI: a handful).")
@bounded_option(
    "--max-tokens",
    16_384,
    16,
    1 << 20,
    "Reply budget: leave room for the thinking, or the answer never comes.",
)
@click.option(
    "--thinking",
    type=click.Choice(["recipe", "on", "off"]),
    default="recipe",
    show_default=True,
    help="recipe: off for humaneval and gsm8k, on for humaneval+ and mbpp+.",
)
@bounded_option("--concurrency", 4, 1, 64, "Requests in flight.")
@bounded_option(
    "--max-seconds",
    480.0,
    0,
    604_800,
    "humaneval: ask no problem past this and drop replies still running; the score is over those "
    "answered (0: no limit, all of them).",
    metavar="S",
)
@bounded_option(
    "--test-timeout", 10.0, 0.5, 600, "humaneval: time limit of one problem's tests.", metavar="S"
)
@click.option("--model", metavar="ID", default=None, help="Model id (default: the first listed).")
@click.option("--api-key", metavar="KEY", envvar="SPARKFOLD_API_KEY", default=None, help="Bearer key.")
@click.option(
    "--out",
    "out_dir",
    metavar="DIR",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("eval-results"),
    show_default=True,
    help="Where results and harness outputs go.",
)
@click.option("--dry-run", is_flag=True, help="gsm8k, humaneval+, mbpp+: print the harness command only.")
@click.option(
    "--progress/--no-progress", default=None, help="Progress bars [default: when stderr is a terminal]."
)
@json_option
def command(
    url: str,
    suites: list[str],
    limit: int | None,
    max_tokens: int,
    thinking: str,
    concurrency: int,
    max_seconds: float,
    test_timeout: float,
    model: str | None,
    api_key: str | None,
    out_dir: Path,
    dry_run: bool,
    progress: bool | None,
    as_json: bool,
) -> None:
    """Score URL's model: HumanEval offline (pass@1, reasoning kept out of the scored text), or a harness."""
    import sys

    options = {
        "model": model,
        "api_key": api_key,
        "limit": limit,
        "max_tokens": max_tokens,
        "concurrency": concurrency,
    }
    failed = False
    reports = []
    for suite in suites:
        think = RECIPE_THINKING[suite] if thinking == "recipe" else thinking == "on"
        if suite != "humaneval":
            failed |= _harness(suite, url, think, dry_run, out_dir, options) != 0
            continue
        shown = sys.stderr.isatty() if progress is None else progress
        try:
            extra = {"timeout_s": test_timeout, "progress": shown, "max_seconds": max_seconds}
            report = _humaneval(url, think, options | extra)
        except (httpx.HTTPError, LookupError) as exc:
            raise click.ClickException(f"{url}: {exc}") from None
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "humaneval.json").write_text(json.dumps(report, indent=2) + "\n")
        reports.append(report)
        failed |= report["errors"] > 0
        if not as_json:
            click.echo(
                f"humaneval: pass@1 {report['pass_at_1']:.3f} ({report['passed']} of {report['problems']}"
                + (
                    f" answered within --max-seconds {max_seconds:g}; {report['of']} asked for"
                    if report["problems"] < report["of"]
                    else ""
                )
                + "), "
                f"{report['model']}, thinking {'on' if think else 'off'}, max_tokens {report['max_tokens']}; "
                f"errors {report['errors']}, out of budget {len(report['truncated'])}"
            )
            for sample in report["error_samples"]:
                click.echo(f"  error: {sample}")
    if as_json:
        echo_json(reports)
    if failed:
        raise SystemExit(1)
