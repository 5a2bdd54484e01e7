"""Options and helpers that several commands share."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from sparkfold.config import DEFAULT_CONFIG_PATH, ConfigError, Settings, load

F = TypeVar("F", bound=Callable[..., Any])


def _file_option(dest: str, default: Path, envvar: str, help: str, load: Callable[[str], Any]) -> Any:
    """``--config FILE`` (env ``envvar``), handed on as ``dest`` = ``load(path)``."""
    return click.option(
        "--config",
        dest,
        metavar="FILE",
        default=str(default),
        show_default=True,
        envvar=envvar,
        callback=lambda ctx, param, value: load(value),
        help=help,
    )


def config_option(func: F) -> F:
    """``--config FILE`` (env ``SPARKFOLD_CONFIG``), loaded and validated into ``settings``."""
    return _file_option(
        "settings", DEFAULT_CONFIG_PATH, "SPARKFOLD_CONFIG", "The node's sparkfold.toml.", load_settings
    )(func)  # type: ignore[no-any-return]


def fleet_option(func: F) -> F:
    """``--config FILE`` (env ``SPARKFOLD_FLEET_CONFIG``): the router host's fleet.toml, validated,
    handed on as ``fleet`` = (settings, path)."""
    from sparkfold.fleet.settings import DEFAULT_FLEET_PATH, load_fleet

    def _load(value: str) -> tuple[Any, Path]:
        try:
            return load_fleet(value), Path(value)
        except ConfigError as exc:
            raise click.ClickException(str(exc)) from None

    return _file_option(
        "fleet", DEFAULT_FLEET_PATH, "SPARKFOLD_FLEET_CONFIG", "The router host's fleet.toml.", _load
    )(func)  # type: ignore[no-any-return]


def bounded_option(
    flag: str,
    default: float | None,
    low: float,
    high: float | None,
    help: str,
    *,
    metavar: str = "N",
    dest: str | None = None,
) -> Callable[[F], F]:
    """A number option between ``low`` and ``high`` (whole numbers when ``low`` and the default
    are ints); its default shown in ``--help`` unless it is ``None``."""
    whole = isinstance(low, int) and not isinstance(default, float)
    kind = (
        click.IntRange(int(low), None if high is None else int(high))
        if whole
        else click.FloatRange(low, high)
    )
    names = [flag, dest] if dest else [flag]
    return click.option(
        *names, metavar=metavar, type=kind, default=default, show_default=default is not None, help=help
    )


def sysfs_option(func: F) -> F:
    """``--sysfs-root DIR`` (env ``SPARKFOLD_SYSFS_ROOT``): where sysfs is mounted (tests hand a fake)."""
    from sparkfold.node.fabric import DEFAULT_SYSFS

    return click.option(
        "--sysfs-root",
        type=click.Path(file_okay=False, path_type=Path),
        default=DEFAULT_SYSFS,
        show_default=True,
        metavar="DIR",
        envvar="SPARKFOLD_SYSFS_ROOT",
        help="Where sysfs is mounted (netdev MTU, RDMA devices, RoCE GIDs).",
    )(func)


def json_option(func: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON for machines.")(func)


def load_settings(path: str | Path) -> Settings:
    try:
        return load(path)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None


def echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))
