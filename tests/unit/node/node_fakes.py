"""Fakes for the node checks: scripted command answers, settings, a fake sysfs RoCE port, and
``nft -j list ruleset`` output built from rules (nftables 1.0's JSON, libnftables-json(5))."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sparkfold.config import Settings, parse


class FakeHost:
    """Answers probe commands from a table keyed by the argv's first words; records every call."""

    def __init__(self) -> None:
        self.answers: dict[tuple[str, ...], tuple[int, str]] = {}
        self.calls: list[list[str]] = []

    def answer(self, prefix: Sequence[str], rc: int = 0, stdout: str | object = "") -> None:
        self.answers[tuple(prefix)] = (rc, stdout if isinstance(stdout, str) else json.dumps(stdout))

    def __call__(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        self.calls.append(list(argv))
        for size in range(len(argv), 0, -1):
            found = self.answers.get(tuple(argv[:size]))
            if found is not None:
                return subprocess.CompletedProcess(list(argv), found[0], found[1], "")
        return subprocess.CompletedProcess(list(argv), 127, "", f"{argv[0]}: command not found")


def settings(**sections: dict[str, object]) -> Settings:
    """A valid Settings with these sections (the engine needs only a model path)."""
    data: dict[str, dict[str, object]] = {"engine": {"model": "/m"}}
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    return parse(data)


def add_roce_port(
    sysfs: Path, netdev: str, hca: str, gids: dict[int, tuple[str, str]], port: int = 1
) -> None:
    """Make ``<sysfs>/class/{net,infiniband}`` entries: netdev -> hca, and GID entries (gid, type)."""
    (sysfs / "class/net" / netdev / "device/infiniband" / hca).mkdir(parents=True)
    base = sysfs / "class/infiniband" / hca / "ports" / str(port)
    (base / "gids").mkdir(parents=True)
    (base / "gid_attrs/types").mkdir(parents=True)
    for index, (gid, kind) in gids.items():
        (base / "gids" / str(index)).write_text(gid + "\n")
        (base / "gid_attrs/types" / str(index)).write_text(kind + "\n")


def match(left: dict[str, Any], right: Any, op: str = "==") -> dict[str, Any]:
    return {"match": {"op": op, "left": left, "right": right}}


def dport(right: Any) -> dict[str, Any]:
    return match({"payload": {"protocol": "tcp", "field": "dport"}}, right)


def saddr(right: Any) -> dict[str, Any]:
    return match({"payload": {"protocol": "ip", "field": "saddr"}}, right)


def ruleset(*rules: list[dict[str, Any]], policy: str = "drop", extra: list[Any] | None = None) -> str:
    """``nft -j list ruleset`` of an inet filter table whose input chain holds ``rules``."""
    items: list[dict[str, Any]] = [
        {"metainfo": {"version": "1.0.9", "release_name": "Old Doc Yak #3", "json_schema_version": 1}},
        {"table": {"family": "inet", "name": "filter", "handle": 1}},
        {
            "chain": {
                "family": "inet",
                "table": "filter",
                "name": "input",
                "handle": 1,
                "type": "filter",
                "hook": "input",
                "prio": 0,
                "policy": policy,
            }
        },
        *(extra or []),
    ]
    for handle, expr in enumerate(rules, start=4):
        rule = {"family": "inet", "table": "filter", "chain": "input", "handle": handle, "expr": expr}
        items.append({"rule": rule})
    return json.dumps({"nftables": items})
