"""Binary byte units, one spelling for the whole runtime: settings say ``*_mib`` / ``*_gib``, code
multiplies by these."""

from __future__ import annotations

__all__ = ["GIB", "MIB"]

MIB = 1 << 20
GIB = 1 << 30
