"""``sparkfold bench URL``: bounded streaming load, TTFT and tokens per second per concurrency."""

from __future__ import annotations

import click
import httpx

from sparkfold.commands._options import echo_json, json_option


def _levels(ctx: click.Context, param: click.Parameter, value: str) -> list[int]:
    try:
        levels = [int(part) for part in value.split(",") if part.strip()]
    except ValueError:
        raise click.BadParameter("a comma-separated list of whole numbers, e.g. 1,4,16") from None
    if not levels or min(levels) < 1 or max(levels) > 256:
        raise click.BadParameter("each level must be between 1 and 256")
    return levels


@click.command()
@click.argument("url")
@click.option(
    "--concurrency",
    "levels",
    metavar="N[,N…]",
    default="1,4",
    show_default=True,
    callback=_levels,
    help="Streams open at once, one level after the other.",
)
@click.option(
    "--requests", metavar="N", default=8, show_default=True, help="Requests per level (at least N)."
)
@click.option("--max-tokens", metavar="N", default=64, show_default=True, help="Reply budget per request.")
@click.option("--model", metavar="ID", default=None, help="Model id (default: the first listed).")
@click.option(
    "--api-key", metavar="KEY", envvar="SPARKFOLD_API_KEY", default=None, help="Bearer key for the gateway."
)
@click.option("--max-seconds", metavar="S", default=300.0, show_default=True, help="Time limit per level.")
@json_option
def command(
    url: str,
    levels: list[int],
    requests: int,
    max_tokens: int,
    model: str | None,
    api_key: str | None,
    max_seconds: float,
    as_json: bool,
) -> None:
    """Stream chat completions from URL (the gateway, or an engine server) and report speed."""
    from sparkfold.bench.load import run_load

    try:
        results = run_load(
            url,
            concurrency=levels,
            requests=requests,
            max_tokens=max_tokens,
            model=model,
            api_key=api_key,
            max_seconds=max_seconds,
        )
    except httpx.HTTPError as exc:
        raise click.ClickException(f"{url}: {exc}") from None
    if as_json:
        echo_json([r.as_dict() for r in results])
    else:
        click.echo("streams  requests  errors  TTFT p50 ms  TTFT p90 ms  stream tok/s  total tok/s")
        for r in results:
            p50 = "-" if r.ttft_p50_ms is None else f"{r.ttft_p50_ms:.1f}"
            p90 = "-" if r.ttft_p90_ms is None else f"{r.ttft_p90_ms:.1f}"
            rate = "-" if r.stream_tok_s_p50 is None else f"{r.stream_tok_s_p50:.1f}"
            click.echo(
                f"{r.concurrency:>7}  {r.requests:>8}  {r.errors:>6}  {p50:>11}  {p90:>11}  {rate:>12}"
                f"  {r.aggregate_tok_s:>11.1f}"
            )
            for sample in r.error_samples:
                click.echo(f"         error: {sample}")
    if any(r.errors for r in results):
        raise SystemExit(1)
