"""Progress lines for long work (hashing, downloads): at most one line per interval, then the last.

Lines go to stderr, so ``--json`` output on stdout stays clean, and they read well in a journal or an
Ansible log where a redrawn bar would not::

    hash: 12.4 GiB of 164.0 GiB (7%), 1.3 GiB/s, model-00003-of-00040.safetensors
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import TextIO

__all__ = ["DEFAULT_INTERVAL_S", "Progress", "human_bytes"]

DEFAULT_INTERVAL_S = 5.0

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def human_bytes(n: float) -> str:
    """``1536`` -> ``'1.5 KiB'``; binary units, one decimal."""
    for unit in _UNITS[:-1]:
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} {_UNITS[-1]}"


class Progress:
    """Counts bytes of ``total`` and prints a line at most every ``interval_s`` seconds.

    Thread-safe: hashing workers call :meth:`advance`, a download watcher calls :meth:`update`.
    ``interval_s=0`` prints on every call (tests); ``stream=None`` means stderr.
    """

    def __init__(
        self,
        label: str,
        total: int,
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.label = label
        self.total = total
        self.done = 0
        self.interval_s = interval_s
        self._stream = stream
        self._clock = clock
        self._started = clock()
        self._last_line = self._started
        self._lock = threading.Lock()

    def advance(self, n: int, note: str = "") -> None:
        with self._lock:
            self.done += n
            self._maybe_print(note)

    def update(self, done: int, note: str = "") -> None:
        with self._lock:
            self.done = done
            self._maybe_print(note)

    def finish(self, note: str = "") -> None:
        with self._lock:
            self._print(note)

    def _maybe_print(self, note: str) -> None:
        if self._clock() - self._last_line >= self.interval_s:
            self._print(note)

    def _print(self, note: str) -> None:
        now = self._clock()
        self._last_line = now
        elapsed = now - self._started
        parts = [f"{human_bytes(self.done)} of {human_bytes(self.total)}"]
        if self.total:
            parts[0] += f" ({100 * self.done // self.total}%)"
        if elapsed > 0:
            parts.append(f"{human_bytes(self.done / elapsed)}/s")
        if note:
            parts.append(note)
        stream = self._stream or sys.stderr
        print(f"{self.label}: {', '.join(parts)}", file=stream, flush=True)
