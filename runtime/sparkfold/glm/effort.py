"""Reasoning-effort names: every spelling clients use, mapped onto GLM's three (the one table).

GLM-5.3's template knows ``low``, ``high`` and ``max`` (reference recipe, ``glm.md`` 6);
OpenAI's names map onto them (``minimal`` → low, ``medium`` → high, ``xhigh`` → max) and ``none``
means thinking off (``None`` here). The gateway validates a request's effort against this table
(:mod:`sparkfold.api.reasoning`); the engine renders it into the prompt (:mod:`sparkfold.glm.render`).
"""

from __future__ import annotations

__all__ = ["DEFAULT_EFFORT", "EFFORTS"]

EFFORTS: dict[str, str | None] = {
    "none": None,
    "minimal": "low",
    "low": "low",
    "medium": "high",
    "high": "high",
    "xhigh": "max",
    "max": "max",
}
DEFAULT_EFFORT = "max"
"""What an unset (or unknown) effort renders as."""
