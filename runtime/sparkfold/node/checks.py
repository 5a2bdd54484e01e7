"""The vocabulary of node checks: one :class:`Check` per fact, gathered in a :class:`Report`.

A check that fails carries ``fix``: one sentence that says what to do. ``sparkfold preflight`` and
``sparkfold fabric`` both answer with a report, printed as lines or as JSON (``--json``) for Ansible.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["Check", "Report", "Runner", "run_command"]

Runner = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]


def run_command(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    """Run a probe command; a missing binary reads as exit code 127, never an exception."""
    try:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=30, check=False)
    except FileNotFoundError:
        return subprocess.CompletedProcess(list(argv), 127, "", f"{argv[0]}: command not found")
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(list(argv), 124, "", f"{argv[0]}: timed out after 30 s")


@dataclass(frozen=True)
class Check:
    """One fact about the node: ``ok``, what was found, and (when not ok) what to do."""

    name: str
    ok: bool
    detail: str
    fix: str = ""
    skipped: bool = False

    @classmethod
    def measured(cls, name: str, enough: bool, detail: str, shortfall: str, fix: str) -> Check:
        """A check of an amount against a need: ``detail`` when there is ``enough``, else the
        ``shortfall`` and what to do about it."""
        return cls(name, True, detail) if enough else cls(name, False, shortfall, fix)

    def line(self) -> str:
        status = "skip" if self.skipped else ("ok" if self.ok else "FAIL")
        text = f"{status:<4} {self.name}: {self.detail}"
        return f"{text}: {self.fix}" if self.fix and not self.ok else text


@dataclass
class Report:
    """All checks of one command, plus the facts it discovered (netdev, GID index, …)."""

    checks: list[Check] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)

    def add(self, check: Check) -> Check:
        self.checks.append(check)
        return check

    @property
    def ok(self) -> bool:
        return all(check.ok for check in self.checks)

    @property
    def failures(self) -> list[Check]:
        return [check for check in self.checks if not check.ok]

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "checks": [asdict(check) for check in self.checks],
            "failures": [check.line() for check in self.failures],
            "facts": self.facts,
        }
