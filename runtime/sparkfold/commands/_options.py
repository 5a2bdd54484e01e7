"""Options and helpers that several commands share."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from sparkfold.config import DEFAULT_CONFIG_PATH, ConfigError, Settings, load

F = TypeVar("F", bound=Callable[..., Any])


def config_option(func: F) -> F:
    """``--config FILE`` (env ``SPARKFOLD_CONFIG``), loaded and validated into ``settings``."""

    def _load(ctx: click.Context, param: click.Parameter, value: str) -> Settings:
        return load_settings(value)

    return click.option(
        "--config",
        "settings",
        metavar="FILE",
        default=str(DEFAULT_CONFIG_PATH),
        show_default=True,
        envvar="SPARKFOLD_CONFIG",
        callback=_load,
        help="The node's sparkfold.toml.",
    )(func)


def fleet_option(func: F) -> F:
    """``--config FILE`` (env ``SPARKFOLD_FLEET_CONFIG``): the router host's fleet.toml, validated,
    handed on as ``fleet`` = (settings, path)."""
    from sparkfold.fleet.settings import DEFAULT_FLEET_PATH, load_fleet

    def _load(ctx: click.Context, param: click.Parameter, value: str) -> tuple[Any, Path]:
        try:
            return load_fleet(value), Path(value)
        except ConfigError as exc:
            raise click.ClickException(str(exc)) from None

    return click.option(
        "--config",
        "fleet",
        metavar="FILE",
        default=str(DEFAULT_FLEET_PATH),
        show_default=True,
        envvar="SPARKFOLD_FLEET_CONFIG",
        callback=_load,
        help="The router host's fleet.toml.",
    )(func)


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
