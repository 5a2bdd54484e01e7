"""Picking the next token from logits: greedy, or seeded sampling with temperature/top-k/top-p/min-p."""

from __future__ import annotations

import torch

from sparkfold.engines.generator import SamplingParams, TokenLogprob

__all__ = ["sample", "token_logprob"]


def sample(logits: torch.Tensor, params: SamplingParams, rng: torch.Generator | None) -> int:
    """The next token id. Greedy is ``argmax``; otherwise filters apply in the order
    temperature, top-k, top-p, min-p, then one draw from ``rng`` (seeded per request)."""
    if params.greedy:
        return int(torch.argmax(logits))
    scores = logits.float() / params.temperature
    if 0 < params.top_k < scores.numel():
        kth = torch.topk(scores, params.top_k).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    if params.top_p < 1.0:
        ordered, order = torch.sort(probs, descending=True)
        beyond = torch.cumsum(ordered, dim=-1) - ordered > params.top_p
        probs = probs.scatter(0, order, ordered.masked_fill(beyond, 0.0))
    if params.min_p > 0.0:
        probs = probs.masked_fill(probs < params.min_p * probs.max(), 0.0)
    return int(torch.multinomial(probs / probs.sum(), 1, generator=rng))


def token_logprob(logits: torch.Tensor, token: int, top: int) -> TokenLogprob:
    """``token``'s log-probability under the model's own distribution (before sampling filters
    and grammar masks, as vLLM reports it) and the ``top`` likeliest tokens'."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    best = torch.topk(logprobs, top) if top > 0 else None
    pairs = tuple(zip(best.indices.tolist(), best.values.tolist(), strict=True)) if best is not None else ()
    return TokenLogprob(token, float(logprobs[token]), pairs)
