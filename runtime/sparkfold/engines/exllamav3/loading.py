"""Loading the exllamav3 engine: model, drafts, vision tower, the pool(s), the generator(s).

:func:`load` builds exllamav3's dynamic generator over ONE paged KV pool and hands back an
:class:`~sparkfold.engines.exllamav3.generator.Exllamav3Generator`. The pool is sized by
:mod:`~sparkfold.engines.exllamav3.sizing`, so a request is refused (400 too long for the window,
503 every lane busy) rather than running the GPU out of memory. Before the engine says ready,
:mod:`~sparkfold.engines.exllamav3.warmup` compiles and tunes what requests would, so the first
ones do not pay it.
"""

from __future__ import annotations

import importlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkfold.config import EngineSettings, Exllamav3Settings
from sparkfold.engines.exllamav3.availability import Exllamav3Unavailable, import_exllamav3
from sparkfold.engines.exllamav3.generator import Exllamav3Generator, Lane
from sparkfold.engines.exllamav3.pages import take_free_pages_first
from sparkfold.engines.exllamav3.sizing import (
    PAGE_TOKENS,
    cache_layer,
    plan_pool,
    request_window,
    round_pages,
    weight_bytes,
)
from sparkfold.engines.exllamav3.vision import VisionPreprocessor
from sparkfold.engines.exllamav3.warmup import serving_plan, warm_lanes, warm_up, warm_up_vision
from sparkfold.units import GIB

__all__ = ["LoadedGenerator", "load", "server_side"]

log = logging.getLogger(__name__)


@dataclass
class LoadedGenerator:
    """What :func:`load` hands back: the generator, its KV pool in tokens, the load time and the
    serving plan (pool sizes, bytes per token, window, what the warm-up sized)."""

    generator: Exllamav3Generator
    pool_tokens: int
    load_s: float
    plan: dict[str, Any]


def _model_config(directory: Path) -> dict[str, Any]:
    data = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    return data.get("text_config", data) | {"_root": data}


def _eos_ids(directory: Path, tokenizer: Any) -> frozenset[int]:
    ids: set[int] = set()
    generation = directory / "generation_config.json"
    if generation.is_file():
        configured = json.loads(generation.read_text(encoding="utf-8")).get("eos_token_id")
        if isinstance(configured, int):
            ids.add(configured)
        elif configured:
            ids.update(configured)
    if isinstance(getattr(tokenizer, "eos_token_id", None), int):
        ids.add(tokenizer.eos_token_id)
    return frozenset(ids)


def _bytes_per_token(exl: Any, model: Any, layer_type: Any, layer_kwargs: dict[str, int]) -> float:
    """KV bytes one token takes in ``model``'s cache: a one-page probe cache, detached again unallocated."""
    probe = exl.Cache(model, max_num_tokens=PAGE_TOKENS, layer_type=layer_type, **layer_kwargs)
    try:
        total = sum(int(layer.storage_size()) for layer in probe.layers.values())
    finally:
        probe.detach_from_model()
    return max(total / PAGE_TOKENS, 1.0)


def _free_gpu_bytes(torch: Any, devices: int) -> int:
    return sum(int(torch.cuda.mem_get_info(d)[0]) for d in range(devices))


def _draft_size(settings: Exllamav3Settings, draft_model: Any) -> int:
    if settings.draft_tokens:
        return settings.draft_tokens
    if draft_model is not None:
        return int(draft_model.caps.get("default_draft_size", 4))
    return 4 if settings.ngram else 0


def _glm_chat(
    settings: EngineSettings, directory: Path, tokenizer: Any, vocab_size: int, preprocessor: Any = None
) -> Any:
    from sparkfold.glm.chat import GlmChat, is_glm_model

    root = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    if not is_glm_model(root):
        return None
    return GlmChat.for_engine(
        settings,
        tokenizer,
        model_dir=directory,
        vocab_size=vocab_size,
        image_processor=preprocessor,
        video_processor=preprocessor,  # one tower measures pictures and clips (vision.py)
        has_vision=preprocessor is not None,
    )


def server_side(settings: EngineSettings, vocab_size: int, pictures: Any = None) -> tuple[Any, Any]:
    """What the HTTP side of an engine core needs: the tokenizer and the GLM protocol; ``pictures``
    (a :class:`~sparkfold.engines.exllamav3.vision.RemoteVisionPreprocessor`) when the core has a
    vision tower, which stays on the GPU, in the core."""
    from transformers import AutoTokenizer

    directory = Path(settings.model)
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    return tokenizer, _glm_chat(settings, directory, tokenizer, vocab_size, pictures)


def load(settings: EngineSettings, on_fatal: Callable[[str], None] | None = None) -> LoadedGenerator:
    """Load the model and its pool(s); raises :class:`Exllamav3Unavailable`, :class:`PoolTooSmall`."""
    started = time.monotonic()
    exl = import_exllamav3()
    torch = importlib.import_module("torch")
    from transformers import AutoTokenizer

    x = settings.exllamav3
    directory = Path(settings.model)
    if not (directory / "config.json").is_file():
        raise FileNotFoundError(f"engine.model {directory} is not an EXL3 model directory (no config.json)")
    devices = settings.tp
    if torch.cuda.device_count() < devices:
        raise Exllamav3Unavailable(
            f"engine.tp = {devices} needs {devices} GPUs; {torch.cuda.device_count()} visible"
        )

    config = exl.Config.from_directory(str(directory))
    model = exl.Model.from_config(config)
    draft_model = None
    draft_dirs: list[Path] = []
    if x.mtp:
        draft_model = exl.Model.from_config(config, component="mtp")
    elif x.drafter != "none":
        draft_dirs.append(Path(x.drafter))
        draft_model = exl.Model.from_config(exl.Config.from_directory(x.drafter))
    vision_model = None
    if "vision" in config.model_classes and devices == 1:  # tp > 1: pictures are refused (serving)
        vision_model = exl.Model.from_config(config, component="vision")
        pp = config.vision_pp
        if pp.max_image_tokens:
            pp.max_image_tokens = min(pp.max_image_tokens, settings.media.max_image_tokens)
        if hasattr(pp, "max_video_tokens"):  # a clip is scaled into [engine.media]'s budget too
            limit = settings.media.max_video_tokens
            pp.max_video_tokens = min(pp.max_video_tokens or limit, limit)
    layer_type, layer_kwargs = cache_layer(exl, x.cache)
    per_token = _bytes_per_token(exl, model, layer_type, layer_kwargs)
    if draft_model is not None:
        per_token += _bytes_per_token(exl, draft_model, layer_type, layer_kwargs)
    draft_size = _draft_size(x, draft_model)
    plain_tokens = 0
    if x.drafts:
        plain_tokens = x.plain_pool_tokens or round_pages(settings.context + PAGE_TOKENS - 1 + draft_size)
    free = _free_gpu_bytes(torch, devices)
    weights = weight_bytes(directory, *draft_dirs)
    reserve = int(x.reserve_gib * GIB * devices)
    plain_bytes = int(plain_tokens * per_token)
    pool = plan_pool(
        free_bytes=free - plain_bytes,
        weight_bytes=weights,
        reserve_bytes=reserve,
        bytes_per_token=per_token,
        window=settings.context + draft_size + 1,
        parallel=settings.parallel,
        configured=x.pool_tokens,
    )
    caches = {
        "main": exl.Cache(
            model,
            max_num_tokens=pool,
            layer_type=layer_type,
            max_batch_size=settings.parallel,
            max_history=draft_size,
            **layer_kwargs,
        )
    }
    if draft_model is not None:
        caches["draft"] = exl.Cache(
            draft_model,
            max_num_tokens=pool,
            layer_type=layer_type,
            max_batch_size=settings.parallel,
            max_history=draft_size,
            **layer_kwargs,
        )
    if plain_tokens:
        caches["plain"] = exl.Cache(
            model,
            max_num_tokens=plain_tokens,
            layer_type=layer_type,
            max_batch_size=settings.parallel,
            **layer_kwargs,
        )
    log.info(
        "KV pool: %d tokens (%s, %.0f bytes/token), plain lane %d tokens; %.1f GiB free, weights %.1f GiB",
        pool,
        x.cache,
        per_token,
        plain_tokens,
        free / GIB,
        weights / GIB,
    )
    load_args: dict[str, Any] = {"max_chunk_size": x.chunk_tokens, "max_batch_size": settings.parallel}
    if draft_model is not None:
        draft_model.load(**load_args)
    model.load(tensor_p=devices > 1, draft_model=draft_model, **load_args)
    if vision_model is not None:
        vision_model.load(device="cuda:0")
    warmed = warm_up(model, caches["main"], settings, draft_size)
    exl_tokenizer = exl.Tokenizer.from_config(config)
    if vision_model is not None:
        warmed |= warm_up_vision(vision_model, exl_tokenizer, settings)
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    common = {
        "max_batch_size": settings.parallel,
        "max_chunk_size": x.chunk_tokens,
        "prefill_cooldown": x.prefill_cooldown,
        "shared_chunk_size": x.shared_chunk_tokens or x.chunk_tokens,
        "recurrent_cache_size": int(x.recurrent_cache_gib * GIB),
    }
    if x.checkpoint_interval:
        common["recurrent_checkpoint_interval"] = x.checkpoint_interval
    if x.prefill_checkpoint_interval:
        common["recurrent_checkpoint_interval_pp"] = x.prefill_checkpoint_interval
    main = exl.Generator(
        model=model,
        cache=caches["main"],
        tokenizer=exl_tokenizer,
        draft_model=draft_model,
        draft_cache=caches.get("draft"),
        num_draft_tokens=draft_size or None,
        ngram_match_min=x.ngram,
        cpu_cache_size=int(x.cpu_cache_gib * GIB),
        disk_cache_dir=str(x.disk_cache_dir) if x.disk_cache_dir else None,
        disk_cache_size=int(x.disk_cache_gib * GIB),
        **common,
    )
    lanes = [Lane("drafted" if x.drafts else "main", main, pool, drafts=x.drafts)]
    if plain_tokens:
        plain = exl.Generator(model=model, cache=caches["plain"], tokenizer=exl_tokenizer, **common)
        lanes.append(Lane("plain", plain, plain_tokens))
    text = _model_config(directory)
    vocab_size = int(text.get("vocab_size") or len(tokenizer))
    window = request_window(
        settings.context,
        min(lane.pool_tokens for lane in lanes),
        draft_size,
        text.get("max_position_embeddings"),
    )
    for lane in lanes:  # a job's start takes free pages without ordering the whole pool
        if not take_free_pages_first(lane.generator.pagetable):
            log.warning("exllamav3's page table is not 1.6.5's: every job start orders the whole pool")
    if x.warmup:
        rounds = serving_plan(
            settings.parallel, x.chunk_tokens, window, text.get("index_topk"), x.shared_chunk_tokens
        )
        warmed |= warm_lanes(
            exl, torch, [lane.generator for lane in lanes], rounds, int(config.vocab_size or vocab_size)
        )
    if window < settings.context:
        log.warning(
            "engine.context %d exceeds what the pool holds; the window is %d", settings.context, window
        )
    generator = Exllamav3Generator(
        exl,
        torch,
        lanes,
        tokenizer,
        context_length=window,
        parallel=settings.parallel,
        eos_token_ids=_eos_ids(directory, tokenizer),
        vocab_size=vocab_size,
        tp=devices,
        stop_on_loop=x.stop_on_loop,
        gather_s=x.gather_ms / 1000,
        glm=_glm_chat(
            settings,
            directory,
            tokenizer,
            vocab_size,
            VisionPreprocessor(vision_model, torch) if vision_model is not None else None,
        ),
        vision=vision_model,
        on_fatal=on_fatal,
    )
    plan = {
        "pool_tokens": pool,
        "plain_pool_tokens": plain_tokens,
        "bytes_per_token": per_token,
        "window": window,
        **warmed,
    }
    return LoadedGenerator(generator, pool, time.monotonic() - started, plan)
