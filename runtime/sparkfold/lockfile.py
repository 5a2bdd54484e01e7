"""Which lock a venv was installed from: ``<venv>/sparkfold-lock``, one line ``<file> sha256:<hex>``.

Written at install time (``make venv``; the runtime role on a node writes the same line, in
roles/sparkfold_runtime/tasks/install.yml), read by ``sparkfold doctor``:

    python -m sparkfold.lockfile record requirements/cpu-py311-x86_64.txt /opt/sparkfold/venv
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass
from pathlib import Path

RECORD = "sparkfold-lock"


@dataclass(frozen=True)
class Installed:
    """The lock file's name and the sha256 of its bytes."""

    name: str
    sha256: str

    def line(self) -> str:
        return f"{self.name} sha256:{self.sha256}"


def digest(lock: Path) -> Installed:
    return Installed(lock.name, hashlib.sha256(lock.read_bytes()).hexdigest())


def record(lock: Path, venv: Path) -> Installed:
    """Write ``venv``'s record of ``lock``; returns what it wrote."""
    found = digest(lock)
    (venv / RECORD).write_text(found.line() + "\n")
    return found


def installed(venv: Path | None = None) -> Installed | None:
    """What ``venv`` (default: the running interpreter's) was installed from; None without a record."""
    path = (venv or Path(sys.prefix)) / RECORD
    try:
        name, _, value = path.read_text().strip().partition(" sha256:")
    except OSError:
        return None
    return Installed(name, value) if name and value else None


def main(argv: list[str]) -> int:
    if len(argv) == 4 and argv[1] == "record":
        print(record(Path(argv[2]), Path(argv[3])).line())
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
