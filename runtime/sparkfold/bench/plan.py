"""Sizing ``sparkfold bench``'s defaults by the endpoint: a first measured request, then a plan
that fits the run's time budget.

The recipe's defaults (three concurrency levels, two rounds after a warm-up, 256-token replies,
64-token exactness replies) take minutes on a GPU and hours on a small CPU endpoint. Before the
suites, one short streamed request measures the endpoint's single-stream decode rate; the plan
then keeps every default it can while the suites' generated tokens, at that rate and with no
batching gain assumed (a CPU endpoint has little), fit their shares of ``budget_s``: the
decode suite half, the exactness suite a sixth. It gives up, in order: longer replies (256 → 64
tokens), the warm-up, the second round, the highest level, then shorter replies still (down to
16 tokens). A knob the user set is kept as set. ``prefill`` and ``reuse`` are sized the same
way by a second request, a ~1,000-word prompt (its prompt tokens / time to first token: a lower
bound of the prefill rate), to a fifth and a sixth of the budget (:func:`long_prompts`). Each
phase's deadline is its share of the budget too.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sparkfold.bench.prompts import KINDS

__all__ = ["DECODE_SHARE", "PHASE_SHARES", "Plan", "Prompts", "long_prompts", "plan"]

DECODE_SHARE = 0.5
EXACT_SHARE = 1 / 6
PHASE_SHARES = {
    "decode": DECODE_SHARE,
    "prefill": 0.2,
    "reuse": 1 / 6,
    "exact": EXACT_SHARE,
    "fairness": 1 / 3,
}
"""Each suite's share of the budget: its deadline (``max_seconds``) under a budget."""
MIN_TOKENS = 16


@dataclass(frozen=True)
class Plan:
    """The decode and exactness sizes a budget allows, and the seconds they are expected to take."""

    levels: tuple[int, ...] = (1, 4, 8)
    rounds: int = 2
    warmup: int = 1
    max_tokens: int = 256
    exact_tokens: int = 64
    decode_s: float = 0.0
    exact_s: float = 0.0

    def decode_tokens(self) -> int:
        """Tokens the decode suite generates: every kind, level, warm-up and round."""
        return len(KINDS) * sum(self.levels) * (self.warmup + self.rounds) * self.max_tokens


def _steps(start: Plan) -> list[Plan]:
    """``start`` and each smaller plan after it, in the order defaults are given up."""
    steps = [start]
    for tokens in (128, 64):
        steps.append(replace(steps[-1], max_tokens=min(tokens, steps[-1].max_tokens)))
    steps.append(replace(steps[-1], warmup=0))
    steps.append(replace(steps[-1], rounds=1))
    if len(steps[-1].levels) > 2:
        steps.append(replace(steps[-1], levels=steps[-1].levels[:2]))
    for tokens in (32, MIN_TOKENS):
        steps.append(replace(steps[-1], max_tokens=min(tokens, steps[-1].max_tokens)))
    return steps


def plan(rate_tok_s: float, budget_s: float, start: Plan, fixed: frozenset[str], exact_requests: int) -> Plan:
    """The first of ``start``'s shrinking steps whose decode tokens fit ``DECODE_SHARE`` of the
    budget at ``rate_tok_s`` (the last step when none does), knobs named in ``fixed`` untouched;
    exactness replies sized to their share likewise."""
    if rate_tok_s <= 0:
        return start

    def keep(candidate: Plan) -> Plan:
        return replace(candidate, **{name: getattr(start, name) for name in fixed if hasattr(start, name)})

    steps = [keep(step) for step in _steps(start)]
    chosen = next((s for s in steps if s.decode_tokens() / rate_tok_s <= DECODE_SHARE * budget_s), steps[-1])
    exact = start.exact_tokens
    if "exact_tokens" not in fixed:
        fits = int(EXACT_SHARE * budget_s * rate_tok_s / (3 * exact_requests))
        exact = max(MIN_TOKENS, min(start.exact_tokens, fits))
    return replace(
        chosen,
        exact_tokens=exact,
        decode_s=chosen.decode_tokens() / rate_tok_s,
        exact_s=3 * exact_requests * exact / rate_tok_s,
    )


@dataclass(frozen=True)
class Prompts:
    """The long prompts of ``prefill`` and ``reuse`` a budget allows, and the prefill rate it assumed."""

    prefill_lengths: tuple[int, ...]
    reuse_tokens: int
    system_tokens: int
    prefill_tok_s: float


def long_prompts(
    rate_tok_s: float, budget_s: float, lengths: list[int], reuse_tokens: int, system_tokens: int
) -> Prompts:
    """``prefill``'s lengths and ``reuse``'s two prompts (each sent twice, a re-send counted as a
    first visit: an endpoint may not reuse) sized so their prefill at ``rate_tok_s`` fits their
    budget shares. Every prefill length is kept: the suite starts each only while the rate it has
    measured says it ends before the phase's deadline, since ``rate_tok_s`` (a short prompt's) is far
    below a GPU's rate on long prompts (a lent H100: ~4k against 60–80k tok/s). Only when even the
    first two do not fit at ``rate_tok_s`` are those two kept, shrunk to fit."""
    allowed = PHASE_SHARES["prefill"] * budget_s * rate_tok_s
    kept = list(lengths)
    if sum(kept[:2]) > allowed:
        kept = [max(64, int(n * allowed / sum(kept[:2]))) for n in kept[:2]]
    reuse = PHASE_SHARES["reuse"] * budget_s * rate_tok_s / 2
    return Prompts(
        tuple(kept),
        max(64, min(reuse_tokens, int(reuse * 2 / 3))),
        max(64, min(system_tokens, int(reuse / 3))),
        rate_tok_s,
    )
