"""``sparkfold conformance URL``: check an engine server against the engine protocol."""

from __future__ import annotations

import click

from sparkfold.commands._options import echo_json, json_option


@click.command()
@click.argument("url")
@click.option("--model", metavar="ID", default=None, help="Model id to request (default: the first listed).")
@click.option(
    "--timeout", "timeout_s", metavar="SECONDS", default=120.0, show_default=True, help="Per request."
)
@json_option
def command(url: str, model: str | None, timeout_s: float, as_json: bool) -> None:
    """Check the engine server at URL (e.g. http://127.0.0.1:18888) against docs/engine-protocol.md.

    Exits 1 when a required check fails; optional checks (later TensorFold additions) only report.
    """
    from sparkfold.conformance import run

    results = run(url, model=model, timeout_s=timeout_s)
    failed = [r for r in results if r.required and not r.passed]
    if as_json:
        echo_json({"ok": not failed, "checks": [r.__dict__ for r in results]})
    else:
        width = max(len(r.name) for r in results)
        for r in results:
            verdict = "pass" if r.passed else ("FAIL" if r.required else "warn")
            click.echo(f"{r.name:<{width}}  {verdict:<4}  {r.detail}")
        click.echo(f"conformance: {sum(r.passed for r in results)} of {len(results)} checks passed")
    if failed:
        raise SystemExit(1)
