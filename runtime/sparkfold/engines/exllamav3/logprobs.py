"""exllamav3's per-token probabilities as the engine's log-probabilities.

A job made with ``return_probs=True, return_top_tokens=k`` (exllamav3 1.6.5
``generator/job.py``, ``Job.receive_logits``) hands back, next to each result's ``token_ids``
``(1, n)``, the chosen tokens' probabilities ``token_probs`` ``(1, n)`` and the ``k`` likeliest
tokens with theirs, ``top_k_tokens`` / ``top_k_probs`` ``(1, n, k)``, best first. exllamav3
computes both as ``softmax`` of the model's raw logits at that position (float32; the padded
vocabulary past the tokenizer's is ``-inf``): before temperature, top-k, top-p and min-p, and
before a grammar filter's mask, which the sampler applies to a copy (``CustomSampler.forward``).
With drafts they come from the verifying forward of the target model, one entry per accepted
token: the distribution of an undrafted reply, up to the rounding of a forward over several
positions. That is the model's own distribution, as the CPU engine reports it
(:func:`sparkfold.engines.transformers.sampling.token_logprob`) and vLLM by default. The stop token that ends
a reply travels in the last result's ``held`` block; its entry is made too, and the response
leaves it out as for the CPU engine.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from sparkfold.engines.generator import TokenLogprob

__all__ = ["LOG_ZERO", "job_kwargs", "token_logprobs"]

LOG_ZERO = -9999.0
"""The log-probability of a token whose float32 probability is 0 (JSON has no ``-inf``; vLLM's value)."""


def job_kwargs(top: int | None) -> dict[str, Any]:
    """The ``Job`` arguments asking for each token's probability and the ``top`` likeliest (none: ``{}``)."""
    if top is None:
        return {}
    return {"return_probs": True, "return_top_tokens": top}


def _log(probability: float) -> float:
    return math.log(probability) if probability > 0.0 else LOG_ZERO


def token_logprobs(result: Mapping[str, Any]) -> list[TokenLogprob]:
    """One entry per token of ``result["token_ids"]`` (a result dict or its ``held`` block)."""
    ids = result.get("token_ids")
    if ids is None:
        return []
    tokens = [int(t) for t in ids.flatten().tolist()]
    chosen = result["token_probs"].flatten().tolist()
    top_ids = result.get("top_k_tokens")
    top_probs = result.get("top_k_probs")
    tops: list[tuple[tuple[int, float], ...]] = [()] * len(tokens)
    if top_ids is not None and top_probs is not None:
        width = int(top_ids.shape[-1])
        rows = zip(top_ids.reshape(-1, width).tolist(), top_probs.reshape(-1, width).tolist(), strict=True)
        tops = [tuple((int(t), _log(p)) for t, p in zip(i, p_, strict=True)) for i, p_ in rows]
    return [TokenLogprob(t, _log(p), top) for t, p, top in zip(tokens, chosen, tops, strict=True)]
