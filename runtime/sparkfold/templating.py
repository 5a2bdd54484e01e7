"""The sandboxed Jinja environment chat templates run in: one place, for every renderer.

A chat template is code that came with the weights: it runs in
:class:`jinja2.sandbox.ImmutableSandboxedEnvironment` (no attribute games, no mutation of the
values it is given), with what Hugging Face templates expect: ``tojson`` (all of ``json.dumps``'
keyword arguments), ``raise_exception``, ``strftime_now`` and loop controls. Each renderer passes
its own ``raise_exception`` so a template's refusal becomes that renderer's error type.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable
from typing import Any

from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

__all__ = ["chat_template_environment"]


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


def chat_template_environment(raise_exception: Callable[[str], Any]) -> ImmutableSandboxedEnvironment:
    """A fresh sandbox for chat templates; ``raise_exception(message)`` is the template's refusal."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env
