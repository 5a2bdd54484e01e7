"""Print a node check report (lines or JSON) and turn failures into exit code 1."""

from __future__ import annotations

import click

from sparkfold.commands._options import echo_json
from sparkfold.node.checks import Report


def emit(report: Report, as_json: bool, what: str) -> None:
    """Print ``report``; exit 1 (one line on stderr) when a check failed. JSON always goes to stdout."""
    if as_json:
        echo_json(report.to_dict())
    else:
        for check in report.checks:
            click.echo(check.line())
    if not report.ok:
        failed = ", ".join(check.name for check in report.failures)
        raise click.ClickException(f"{what} failed: {failed} (see above)")
