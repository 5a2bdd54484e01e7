"""The engine's warm-up: before it says ready, every shape a request takes is compiled and tuned.

Three stages, each recorded in the load plan (``WARMUP_PHASES``; their sum is the start line's
warm-up phase):

1. :func:`warm_up`, exllamav3's own ``Model.warmup`` on the main pool before a generator is
   attached to it: single rows of 1 to 64 tokens (the GEMM autotuner's buckets), one prefill chunk,
   a batched decode family at ``parallel`` and at 1, a long-context family.
2. :func:`warm_lanes`, the serving plan (:func:`serving_plan`) run through each lane's generator
   as requests run: exllamav3's graph-captured decode compiles its kernels per (batch size, query
   length, regime) slot, with the batch size and the query length as compile-time values
   (``exllamav3/modules/attention_fn/bc_mla.py``, ``BCMLA.step``, 1.6.5; regime 1 once a batch's
   longest context passes the model's ``index_topk``, DSA's sparse selection), so stage 1's two
   batch sizes leave the others to the first requests. The plan decodes at every batch size up to
   ``parallel``, below and past the sparse threshold, beside a prompt read in several chunks.
3. :func:`warm_up_vision`, the vision tower on blank pictures of two sizes.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sparkfold.config import EngineSettings
from sparkfold.engines.exllamav3.jobs import sampler_for
from sparkfold.engines.generator import SamplingParams

__all__ = [
    "WARMUP_PHASES",
    "WarmJob",
    "WarmRound",
    "serving_plan",
    "warm_lanes",
    "warm_up",
    "warm_up_vision",
]

log = logging.getLogger(__name__)

WARMUP_PHASES = ("warmup_s", "serving_warmup_s", "vision_warmup_s")
"""The load plan's keys of the warm-up's stages, in seconds."""

SHORT_PROMPT = 40
"""Tokens of a warm-up stream's prompt: under one page, as a short chat turn's."""

TAIL_TOKENS = 4
"""Tokens each warm-up job decodes once the jobs beside it are decoding too."""

PREFILL_TAILS = (2, 3, 5, 9, 16, 17, 32, 33, 48, 65, 80, 129, 144)
"""Prompt lengths of the ``prompt tails`` round, each also one longer: a prefill pass of up to 256
tokens runs the KDA layers' ``_causal_conv1d_update_slotted_kernel``, compiled per power of two of
the pass's length (``BLOCK_S``) and per length divisible by 16 or not (Triton's specialization of
an integer argument; ``exllamav3/modules/gated_delta_net_fn/conv1d.py``, 1.6.5), so every such
class up to 256 is read once."""


@dataclass(frozen=True)
class WarmJob:
    """One warm-up job: a prompt of random token ids and the tokens to decode after it."""

    prompt_tokens: int
    new_tokens: int


@dataclass(frozen=True)
class WarmRound:
    """Jobs enqueued together and run until all are done."""

    label: str
    jobs: tuple[WarmJob, ...]


def serving_plan(
    parallel: int, chunk_tokens: int, window: int, sparse_after: int | None, shared_tokens: int = 0
) -> tuple[WarmRound, ...]:
    """The rounds :func:`warm_lanes` runs through a lane's generator.

    ``prompt tails``: short prompts of every length class a prefill pass compiles for
    (:data:`PREFILL_TAILS`), at most ``parallel`` at a time (the generator queues the rest).
    ``decode batch b`` (b = 1 … ``parallel``): b short prompts decoded together, a decode step at
    each batch size below the sparse threshold. ``long prompt beside b - 1`` (b = 1 … ``parallel``):
    one prompt past ``sparse_after`` (the model's ``index_topk``; ``None`` without sparse attention)
    and longer than one chunk, with a ragged last chunk, read while b - 1 short streams decode; the
    streams outlast its prefill (in chunks of ``shared_tokens`` while they decode, 0: the chunk),
    so its first tokens are decoded with theirs, a step at batch b past the threshold. The long
    prompt is cut to fit ``window``.
    """
    long = max(chunk_tokens, sparse_after or 0) + chunk_tokens // 2 + 7
    long = min(long, window - 2 * TAIL_TOKENS)
    chunks = math.ceil(long / min(shared_tokens or chunk_tokens, chunk_tokens))
    tails = sorted({n + extra for n in PREFILL_TAILS for extra in (0, 1)})
    rounds = [WarmRound("prompt tails", tuple(WarmJob(n, 2) for n in tails))]
    rounds += [
        WarmRound(f"decode batch {b}", tuple(WarmJob(SHORT_PROMPT + i, TAIL_TOKENS) for i in range(b)))
        for b in range(1, parallel + 1)
    ]
    for b in range(1, parallel + 1):
        streams = tuple(WarmJob(SHORT_PROMPT + i, chunks + 2 * TAIL_TOKENS) for i in range(b - 1))
        rounds.append(WarmRound(f"long prompt beside {b - 1}", (WarmJob(long, TAIL_TOKENS), *streams)))
    return tuple(rounds)


def _run_round(exl: Any, torch: Any, generator: Any, round_: WarmRound, vocab_size: int, rng: Any) -> None:
    jobs = [
        exl.Job(
            input_ids=torch.randint(0, vocab_size, (1, job.prompt_tokens), generator=rng),
            max_new_tokens=job.new_tokens,
            stop_conditions=[],  # exactly new_tokens each: the jobs decode side by side to the end
            sampler=sampler_for(exl, SamplingParams(job.new_tokens, temperature=float(i % 2))),
            seed=i,
        )
        for i, job in enumerate(round_.jobs)
    ]
    for job in jobs:
        generator.enqueue(job)
    steps = sum(job.prompt_tokens + job.new_tokens for job in round_.jobs)  # one token a step at worst
    while generator.num_remaining_jobs():
        if steps <= 0:
            raise RuntimeError("the generator did not finish the round's jobs")
        generator.iterate()
        steps -= 1


def warm_lanes(
    exl: Any, torch: Any, generators: Sequence[Any], rounds: Sequence[WarmRound], vocab_size: int
) -> dict[str, Any]:
    """Run ``rounds`` through each of ``generators`` (the lanes' exllamav3 generators, before the
    engine thread drives them): what the load plan records (``serving_warmup_s``,
    ``serving_warmup_failed``). A round that raises is a warning naming it; its jobs are dropped
    and the engine still serves (those shapes pay their compiles in the first requests). The
    prompts are random token ids: their pages never match a request's prompt, and are evicted as
    the pool fills like any unreferenced page.
    """
    started = time.monotonic()
    rng = torch.Generator().manual_seed(0)
    failed: list[str] = []
    for generator in generators:
        for round_ in rounds:
            try:
                _run_round(exl, torch, generator, round_, vocab_size, rng)
            except Exception as exc:  # the engine still serves; these shapes compile on first use
                failed.append(f"{round_.label}: {exc}")
                generator.clear_queue()
    seconds = round(time.monotonic() - started, 1)
    _report("the serving warm-up", "round(s)", failed, seconds)
    return {"serving_warmup_s": seconds, "serving_warmup_failed": failed}


def _report(stage: str, unit: str, failed: Sequence[str], seconds: float) -> None:
    """One log line for a warm-up stage: its seconds, or a warning naming what raised."""
    if failed:
        log.warning(
            "%s: %d %s raised (%s); those shapes pay their first-use costs in the first requests",
            stage,
            len(failed),
            unit,
            "; ".join(failed),
        )
    else:
        log.info("%s: %.1f s", stage, seconds)


def warm_up(model: Any, cache: Any, settings: EngineSettings, draft_size: int) -> dict[str, Any]:
    """exllamav3's own warm-up of the loaded model, when ``[engine.exllamav3] warmup`` is on: what
    the load plan records (``warmup_s``, ``warmup_failed``), empty when off.

    ``Model.warmup`` (exllamav3/model/model.py, 1.6.5) runs a short schedule of forward passes (single
    rows of 1 to 64 tokens, one prefill chunk, a batched decode family, a long-context family)
    that compiles Triton kernels, runs the GEMM autotuner and sizes the graph-captured decode paths'
    workspaces; exllamav3 asks for it after ``load()`` and before a generator is attached to the
    cache, as its passes write into the cache's leading pages. A pass that raises is reported and
    skipped by exllamav3; the engine still serves, those shapes pay their costs on first use.
    """
    if not settings.exllamav3.warmup:
        return {}
    started = time.monotonic()
    failed = model.warmup(
        cache=cache,
        max_chunk_size=settings.exllamav3.chunk_tokens,
        max_batch_size=settings.parallel,
        max_q_len=draft_size + 1,
    )
    seconds = round(time.monotonic() - started, 1)
    _report("exllamav3's warm-up", "pass(es)", failed, seconds)
    return {"warmup_s": seconds, "warmup_failed": list(failed)}


VISION_WARMUP_SIZES = ((224, 224), (448, 336))
"""Blank pictures the vision tower embeds at start: two grids, so a shape-keyed kernel compiles
for more than one size (a picture of another size may still tune on first use)."""


def warm_up_vision(vision_model: Any, tokenizer: Any, settings: EngineSettings) -> dict[str, Any]:
    """Embed blank pictures through the vision tower, the path a request's pictures take
    (``get_image_embeddings``), so the first picture does not pay the tower's compiles: what the
    load plan records (``vision_warmup_s``), empty when ``warmup`` is off.

    exllamav3's ``Model.warmup`` does not suit the vision component: its passes feed token ids
    through the text model's cache and recurrent paths (``exllamav3/model/model.py``, 1.6.5).
    """
    if not settings.exllamav3.warmup:
        return {}
    from PIL import Image

    started = time.monotonic()
    try:
        for size in VISION_WARMUP_SIZES:
            vision_model.get_image_embeddings(tokenizer, Image.new("RGB", size, (128, 128, 128)))
    except Exception as exc:  # the tower still serves; the first picture pays what is left
        log.warning("the vision tower's warm-up raised: %s", exc)
        return {"vision_warmup_failed": str(exc)}
    seconds = round(time.monotonic() - started, 1)
    log.info("the vision tower's warm-up: %.1f s", seconds)
    return {"vision_warmup_s": seconds}
