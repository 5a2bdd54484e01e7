"""One request as an exllamav3 ``Job``: sampler, stop conditions, grammar filter, pictures, probabilities."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sparkfold.engines.exllamav3.logprobs import job_kwargs
from sparkfold.engines.generator import SamplingParams

__all__ = ["LOOP_GUARD", "job_for", "matcher_filter", "sampler_for", "stop_ids"]

LOOP_GUARD = (64, 4)
"""``stop_on_loop``: a window of 64 tokens repeated 4 times ends the reply (exllamav3's loop guard)."""


def sampler_for(exl: Any, params: SamplingParams) -> Any:
    """exllamav3's sampler for ``params`` (argmax when greedy)."""
    if params.greedy:
        return exl.ArgmaxSampler()
    return exl.ComboSampler(
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k,
        min_p=params.min_p,
    )


def stop_ids(params: SamplingParams, eos_token_ids: frozenset[int]) -> list[int]:
    """Token ids that end a reply: the request's stop tokens, and end-of-sequence unless ignored."""
    ids = set(params.stop_token_ids)
    if not params.ignore_eos:
        ids |= eos_token_ids
    return sorted(ids)


def matcher_filter(exl: Any, tokenizer: Any, matcher: Any) -> Any:
    """An exllamav3 ``Filter`` driven by ``sparkfold.glm``'s matcher (packed int32 token bitmask).

    The matcher itself waits for ``</think>`` before it constrains, so the filter is active from
    the first token and never "completes": once the grammar is done the matcher allows only stop
    tokens, and the reply ends on one of them like any other.
    """
    return _filter_class(exl)(tokenizer, matcher)


_FILTER_CLASSES: dict[int, type] = {}


def _filter_class(exl: Any) -> type:
    cached = _FILTER_CLASSES.get(id(exl))
    if cached is not None:
        return cached

    from sparkfold.glm.grammar import allocate_bitmask

    class MatcherFilter(exl.Filter):  # type: ignore[name-defined,misc]
        def __init__(self, tokenizer: Any, matcher: Any) -> None:
            super().__init__(tokenizer, None, None, False)
            self.matcher = matcher

        def reset(self) -> None:
            self.matcher.reset()

        def accept_token(self, token: int) -> None:
            self.matcher.accept_token(int(token))

        def get_next_logit_mask(self) -> Any:
            mask = allocate_bitmask(self.matcher.vocab_size)
            if not self.matcher.fill_bitmask(mask, 0):
                mask.fill_(-1)  # nothing to constrain this step (a thinking budget not yet spent)
            return mask

        def is_completed(self) -> bool:
            return False

        def rollback_tokens(self, num_tokens: int) -> bool:
            self.matcher.rollback(num_tokens)
            return True

        def use_background_worker(self) -> bool:
            return False

    _FILTER_CLASSES[id(exl)] = MatcherFilter
    return MatcherFilter


def job_for(
    exl: Any,
    torch: Any,
    prompt_ids: Sequence[int],
    params: SamplingParams,
    *,
    eos_token_ids: frozenset[int],
    tokenizer: Any,
    stop_on_loop: bool,
    embeddings: list[Any] | None = None,
) -> Any:
    """The exllamav3 ``Job`` for one request."""
    kwargs: dict[str, Any] = {
        "input_ids": torch.tensor([list(prompt_ids)], dtype=torch.long),
        "max_new_tokens": params.max_tokens,
        "sampler": sampler_for(exl, params),
        "seed": params.seed,
        "stop_conditions": stop_ids(params, eos_token_ids),
        "decode_special_tokens": True,
        **job_kwargs(params.logprobs),
    }
    if params.constraint is not None:
        kwargs["filters"] = [matcher_filter(exl, tokenizer, params.constraint)]
    if stop_on_loop:
        kwargs["stop_on_loop"] = LOOP_GUARD
    if embeddings:
        kwargs["embeddings"] = embeddings
    return exl.Job(**kwargs)
