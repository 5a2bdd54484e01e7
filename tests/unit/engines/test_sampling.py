from __future__ import annotations

import torch

from sparkfold.engines.generator import SamplingParams
from sparkfold.engines.transformers.sampling import sample

LOGITS = torch.tensor([0.1, 2.0, 1.9, -1.0, 0.5])


def test_greedy_is_argmax() -> None:
    assert sample(LOGITS, SamplingParams(max_tokens=1, temperature=0), None) == 1


def test_seeded_sampling_repeats() -> None:
    params = SamplingParams(max_tokens=1, temperature=1.0, seed=7)
    draws = [
        [sample(LOGITS, params, g) for _ in range(20)]
        for g in (torch.Generator().manual_seed(7), torch.Generator().manual_seed(7))
    ]
    assert draws[0] == draws[1]
    assert len(set(draws[0])) > 1  # it really samples


def test_top_k_one_is_greedy() -> None:
    params = SamplingParams(max_tokens=1, temperature=1.5, top_k=1)
    assert {sample(LOGITS, params, torch.Generator().manual_seed(s)) for s in range(10)} == {1}


def test_top_p_and_min_p_keep_only_the_likely_tokens() -> None:
    for params in (
        SamplingParams(max_tokens=1, temperature=1.0, top_p=0.5),
        SamplingParams(max_tokens=1, temperature=1.0, min_p=0.5),
    ):
        drawn = {sample(LOGITS, params, torch.Generator().manual_seed(s)) for s in range(30)}
        assert drawn <= {1, 2}
