"""Fakes for the node checks: scripted command answers, settings, a fake sysfs RoCE port."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from pathlib import Path

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
