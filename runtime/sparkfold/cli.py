"""``sparkfold …``: the command-line entry points.

Thin by design: each command lives in its own module under ``sparkfold.commands`` (found by name,
imported only when run, so ``sparkfold --help`` stays fast and a command's heavy imports never slow
another). A command parses its options, calls one package function and prints the answer.
Expected failures raise :class:`click.ClickException`: one line on stderr, exit code 1.
"""

from __future__ import annotations

import importlib
import pkgutil

import click

from sparkfold import commands, version_line

__all__ = ["main"]


class _CommandsGroup(click.Group):
    """Finds ``sparkfold.commands.<name>.command`` lazily; ``config_cmd`` is ``config``."""

    @staticmethod
    def _modules() -> dict[str, str]:
        found = {}
        for info in pkgutil.iter_modules(commands.__path__):
            if not info.name.startswith("_"):
                found[info.name.removesuffix("_cmd").replace("_", "-")] = info.name
        return found

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(self._modules())

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        module = self._modules().get(cmd_name)
        if module is None:
            return None
        command: click.Command = importlib.import_module(f"{commands.__name__}.{module}").command
        return command


@click.group(cls=_CommandsGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(version_line(), prog_name="sparkfold", message="%(prog)s %(version)s")
def main() -> None:
    """Serve GLM-5.3-Flash from a pair of nodes: engine ranks, the API gateway, node checks."""
