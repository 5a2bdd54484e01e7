"""How one generation ended: :class:`Outcome`, and its ``tensorfold`` stats block."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from sparkfold.engines.generator import GenerationReport

__all__ = ["Outcome"]


@dataclass
class Outcome:
    """How a generation ended."""

    finish_reason: str
    prompt_tokens: int
    token_ids: list[int]
    prefill_s: float
    decode_s: float
    report: GenerationReport = field(default_factory=GenerationReport)
    stop_reason: str | None = None
    """The stop string that ended the reply, if one did."""
    reasoning_tokens: int = 0

    def stats(self) -> dict[str, object]:
        """The ``tensorfold`` stats block."""
        digest = hashlib.sha256(",".join(map(str, self.token_ids)).encode()).hexdigest()[:16]
        rate = (
            (len(self.token_ids) - 1) / self.decode_s if self.decode_s > 0 and len(self.token_ids) > 1 else 0
        )
        return {
            "prefill_s": round(self.prefill_s, 4),
            "decode_s": round(self.decode_s, 4),
            "decode_tok_s": round(rate, 2),
            "cached": self.report.cached_tokens,
            "rounds": 0,
            "drafted": self.report.drafted,
            "accepted": self.report.accepted,
            "token_sha": digest,
            "prepare_s": round(self.report.prepare_s, 4),
            **(
                {"phases_s": {k: round(v, 4) for k, v in self.report.phases_s.items()}}
                if self.report.phases_s
                else {}
            ),
        }
