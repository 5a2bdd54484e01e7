"""The ``exllamav3`` engine: GLM-5.3-Flash (or any EXL3 model) on this host's GPUs.

Prompt rendering, output parsing and the structured-output matcher are ``sparkfold.glm``'s,
exactly as for the CPU engine, so the gateway cannot tell the two apart. One module per job:

``availability``  importing exllamav3 (and torch with CUDA) only when the engine starts
``sizing``        the KV pool and the request window, from free memory (pure)
``jobs``          one request as an exllamav3 ``Job`` (sampler, stops, grammar filter)
``logprobs``      exllamav3's per-token probabilities as log-probabilities
``vision``        pictures and video clips: their placeholder runs and embeddings
``pages``         free KV pages first: a job's start without ordering the whole pool
``generator``     the engine thread over exllamav3's generator(s)
``warmup``        the warm-up: exllamav3's, the serving plan through each lane, the vision tower
``loading``       :func:`load`: model, drafts, vision tower, pools, warm-up, generator
"""

from __future__ import annotations

from sparkfold.engines.exllamav3.availability import Exllamav3Unavailable, import_exllamav3
from sparkfold.engines.exllamav3.generator import Exllamav3Generator, Lane
from sparkfold.engines.exllamav3.jobs import job_for, matcher_filter, sampler_for, stop_ids
from sparkfold.engines.exllamav3.loading import LoadedGenerator, load
from sparkfold.engines.exllamav3.sizing import (
    PAGE_TOKENS,
    PoolTooSmall,
    cache_layer,
    plan_pool,
    request_window,
    round_pages,
    weight_bytes,
)
from sparkfold.engines.exllamav3.vision import (
    VisionPreprocessor,
    embed_video,
    prompt_spans,
    splice_embeddings,
)
from sparkfold.engines.exllamav3.warmup import (
    WARMUP_PHASES,
    WarmJob,
    WarmRound,
    serving_plan,
    warm_lanes,
    warm_up,
    warm_up_vision,
)

__all__ = [
    "PAGE_TOKENS",
    "WARMUP_PHASES",
    "Exllamav3Generator",
    "Exllamav3Unavailable",
    "Lane",
    "LoadedGenerator",
    "PoolTooSmall",
    "VisionPreprocessor",
    "WarmJob",
    "WarmRound",
    "cache_layer",
    "embed_video",
    "import_exllamav3",
    "job_for",
    "load",
    "matcher_filter",
    "plan_pool",
    "prompt_spans",
    "request_window",
    "round_pages",
    "sampler_for",
    "serving_plan",
    "splice_embeddings",
    "stop_ids",
    "warm_lanes",
    "warm_up",
    "warm_up_vision",
    "weight_bytes",
]
