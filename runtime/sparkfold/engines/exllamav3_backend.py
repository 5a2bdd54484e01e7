"""The ``exllamav3`` engine: GLM-5.3-Flash (or any EXL3 model) on this host's GPUs.

:func:`load` builds exllamav3's dynamic generator over ONE paged KV pool and hands back an
:class:`Exllamav3Generator`, the :class:`~sparkfold.engines.generator.Generator` the shared
server uses. Prompt rendering, output parsing and the structured-output matcher are
``sparkfold.glm``'s, exactly as for the CPU engine, so the gateway cannot tell the two apart.

Scheduling: one engine thread owns the model. Up to ``parallel`` requests run as exllamav3 jobs
at once over the one pool; exllamav3 batches their steps, reuses cached prompt pages (and
recurrent-state checkpoints of the KDA layers) and drafts tokens when drafts are configured. With
drafts on, a second, undrafted lane (its own small pool over the same weights) serves requests
that ask for ``"draft": false``.

Memory: the pool is sized once, at start, from free GPU memory minus the weights and a reserve,
and capped by the window; a request never allocates GPU memory of its own, so it is refused (400
too long for the window, 503 every lane busy) rather than running the GPU out of memory.

Nothing here imports exllamav3 or torch at module import: the CUDA extension loads when the
engine starts (:func:`import_exllamav3`), so CPU-only tests and ``sparkfold --help`` never need it.
"""

from __future__ import annotations

import importlib
import json
import logging
import queue
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from sparkfold.config import EngineSettings, Exllamav3Settings
from sparkfold.engines.generator import (
    CapacityError,
    EngineFailure,
    GenerationReport,
    SamplingParams,
)
from sparkfold.engines.threaded import Job, ThreadedEngine
from sparkfold.glm.tokens import IMAGE

__all__ = [
    "PAGE_TOKENS",
    "Exllamav3Generator",
    "Exllamav3Unavailable",
    "PoolTooSmall",
    "VisionPreprocessor",
    "import_exllamav3",
    "load",
    "plan_pool",
    "splice_embeddings",
]

log = logging.getLogger(__name__)

PAGE_TOKENS = 256
"""exllamav3's cache page: pools and windows are whole pages."""
GIB = 1024**3
IDLE_WAIT_S = 0.5
GATHER_SPAN = 8
"""A burst is gathered for at most ``GATHER_SPAN`` × ``gather_s`` in all."""
STATS_EVERY_S = 0.5
LOOP_GUARD = (64, 4)
"""``stop_on_loop``: a window of 64 tokens repeated 4 times ends the reply (exllamav3's loop guard)."""
QUANT_BITS = {"q8": 8, "q6": 6, "q4": 4}


class Exllamav3Unavailable(RuntimeError):
    """exllamav3 or a CUDA device is missing on this host."""


class PoolTooSmall(ValueError):
    """Free GPU memory cannot hold the weights, the reserve and one window of KV cache."""


def import_exllamav3() -> ModuleType:
    """``exllamav3`` (which loads or builds its CUDA extension); a clear error when it cannot run here."""
    try:
        torch = importlib.import_module("torch")
    except ImportError as exc:
        raise Exllamav3Unavailable(f"the exllamav3 engine needs torch with CUDA: {exc}") from None
    if not torch.cuda.is_available():
        raise Exllamav3Unavailable(
            'engine.kind = "exllamav3" needs an NVIDIA GPU with CUDA; none is visible here '
            '(use kind = "transformers" on CPU)'
        )
    try:
        return importlib.import_module("exllamav3")
    except ImportError as exc:
        raise Exllamav3Unavailable(
            f"exllamav3 is not installed ({exc}); install sparkfold[exllamav3] (exllamav3 >= 1.6.5)"
        ) from None


# --- sizing (pure: unit-tested without a GPU) ---------------------------------------------------


def round_pages(tokens: int) -> int:
    """``tokens`` rounded down to whole cache pages."""
    return max(tokens, 0) // PAGE_TOKENS * PAGE_TOKENS


def plan_pool(
    *,
    free_bytes: int,
    weight_bytes: int,
    reserve_bytes: int,
    bytes_per_token: float,
    window: int,
    parallel: int,
    configured: int = 0,
) -> int:
    """Tokens of the shared KV pool: what free memory holds after weights and reserve, in pages.

    Capped at ``parallel`` full windows (more can never be used at once) and at ``configured``
    when set. Raises :class:`PoolTooSmall` when not even one page fits, or when ``configured``
    asks for more than fits.
    """
    if bytes_per_token <= 0:
        raise ValueError("bytes_per_token must be positive")
    spare = free_bytes - weight_bytes - reserve_bytes
    fits = round_pages(int(spare // bytes_per_token)) if spare > 0 else 0
    room = f"{max(spare, 0) / GIB:.1f} GiB"
    costs = f"weights {weight_bytes / GIB:.1f} GiB, reserve_gib {reserve_bytes / GIB:.1f} GiB"
    if configured:
        if configured > fits:
            wanted = f"{configured * bytes_per_token / GIB:.1f} GiB"
            raise PoolTooSmall(
                f"engine.exllamav3.pool_tokens = {configured} needs {wanted} of KV; {room} free ({costs})"
            )
        return configured
    useful = round_pages(parallel * window + PAGE_TOKENS - 1) or PAGE_TOKENS
    if fits < PAGE_TOKENS:
        raise PoolTooSmall(f"no room for a KV pool: {room} free ({costs}); lower reserve_gib or the model")
    return min(fits, useful)


def request_window(context: int, pool_tokens: int, draft_tokens: int, max_positions: int | None) -> int:
    """The per-request window: ``context``, but never more than the pool (minus draft headroom) holds."""
    headroom = draft_tokens + 1
    window = min(context, pool_tokens - headroom)
    if max_positions:
        window = min(window, max_positions)
    return window


def weight_bytes(*directories: str | Path) -> int:
    """Bytes of the safetensors files in these model directories (an upper bound of what loads)."""
    return sum(f.stat().st_size for d in directories for f in Path(d).glob("*.safetensors"))


def cache_layer(exl: Any, cache: str) -> tuple[Any, dict[str, int]]:
    """exllamav3's cache layer class and its keyword arguments for ``engine.exllamav3.cache``."""
    if cache == "fp16":
        return exl.CacheLayer_fp16, {}
    bits = QUANT_BITS[cache]
    return exl.CacheLayer_quant, {"k_bits": bits, "v_bits": bits}


# --- requests -----------------------------------------------------------------------------------


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
                mask.fill_(-1)  # inactive (still thinking): every token allowed
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
    }
    if params.constraint is not None:
        kwargs["filters"] = [matcher_filter(exl, tokenizer, params.constraint)]
    if stop_on_loop:
        kwargs["stop_on_loop"] = LOOP_GUARD
    if embeddings:
        kwargs["embeddings"] = embeddings
    return exl.Job(**kwargs)


def splice_embeddings(prompt: Sequence[int], image_token: int, spans: Sequence[range]) -> list[int]:
    """``prompt`` with the n-th run of ``image_token`` replaced by the n-th picture's embedding ids.

    exllamav3 marks where an ``MMEmbedding`` goes by ids past the vocabulary (its
    ``first_index`` … ``last_index``); each run of placeholders must be as long as its picture.
    """
    out: list[int] = []
    runs = iter(spans)
    i = 0
    while i < len(prompt):
        if prompt[i] != image_token:
            out.append(prompt[i])
            i += 1
            continue
        end = i
        while end < len(prompt) and prompt[end] == image_token:
            end += 1
        span = next(runs, None)
        if span is None or len(span) != end - i:
            size = len(span) if span is not None else 0
            raise ValueError(f"a picture takes {end - i} placeholder tokens, its embedding {size}")
        out.extend(span)
        i = end
    if next(runs, None) is not None:
        raise ValueError("more pictures than placeholder runs in the prompt")
    return out


class VisionPreprocessor:
    """exllamav3's own picture preparation, in the shape ``sparkfold.glm.media.vision_inputs`` calls.

    It only measures each picture (its patch grid, hence its token count, so the prompt gets the
    right number of placeholders); the pictures themselves travel in ``prefill_inputs`` and the
    engine thread runs the vision tower on them (:meth:`Exllamav3Generator._embed_pictures`).
    """

    def __init__(self, vision_model: Any, torch: Any) -> None:
        self._vision = vision_model
        self._torch = torch
        self.merge_size = int(vision_model.config.vision.spatial_merge_size)

    def __call__(self, images: Sequence[Any], **_: Any) -> dict[str, Any]:
        grids = [list(self._vision.preprocess(image)[2]) for image in images]
        return {"pixel_values": list(images), "image_grid_thw": self._torch.tensor(grids)}


# --- the generator ------------------------------------------------------------------------------


@dataclass(eq=False)
class _Request(Job):
    lane: str = ""
    job: Any = None
    last: int | None = None


@dataclass
class Lane:
    """One exllamav3 generator and its pool: ``drafted`` (the main one) or ``plain``."""

    name: str
    generator: Any
    pool_tokens: int
    drafts: bool = False


@dataclass
class _Snapshot:
    pool: dict[str, int] = field(default_factory=dict)
    at: float = 0.0


class Exllamav3Generator(ThreadedEngine[_Request]):
    """Requests in, token ids out: one engine thread drives exllamav3's generator(s)."""

    backend = "exllamav3"
    job_type = _Request

    def __init__(
        self,
        exl: Any,
        torch: Any,
        lanes: Sequence[Lane],
        tokenizer: Any,
        *,
        context_length: int,
        parallel: int,
        eos_token_ids: frozenset[int],
        vocab_size: int,
        tp: int = 1,
        stop_on_loop: bool = False,
        gather_s: float = 0.0,
        glm: Any = None,
        vision: Any = None,
        on_fatal: Callable[[str], None] | None = None,
    ) -> None:
        self._exl = exl
        self._vision = vision
        self._image_token: int | None = None
        if vision is not None:
            self._image_token = int(tokenizer.convert_tokens_to_ids(IMAGE))
        self._torch = torch
        self._lanes = {lane.name: lane for lane in lanes}
        self._main = lanes[0]
        self.context_length = context_length
        self.parallel = parallel
        self.eos_token_ids = eos_token_ids
        self.vocab_size = vocab_size
        self.tp = tp
        self.glm = glm
        self._stop_on_loop = stop_on_loop
        self._gather_s = gather_s
        self._on_fatal = on_fatal
        self._running: dict[Any, _Request] = {}
        self._snapshot = _Snapshot()
        self.totals = {"drafted": 0, "accepted": 0, "cached": 0}
        self._start(tokenizer)

    def close(self) -> None:
        """Stop the engine thread (ending what still runs) and release exllamav3's workers."""
        super().close()
        for lane in self._lanes.values():
            closer = getattr(lane.generator, "close", None)
            if callable(closer):
                try:
                    closer()
                except Exception:  # shutting down: log, never raise
                    log.exception("closing the %s lane failed", lane.name)

    # --- status ---------------------------------------------------------------------------------

    def pool_stats(self) -> dict[str, int]:
        """``/health``'s ``pool`` block: the last snapshot the engine thread took."""
        return dict(self._snapshot.pool)

    def metrics_text(self) -> str:
        """Prometheus gauges of the pool, appended to the server's ``/metrics``."""
        help_ = {
            "pool_tokens": "KV pool size in tokens (all lanes share it)",
            "free_tokens": "pool tokens holding nothing (neither running nor reusable)",
            "kept_tokens": "pool tokens of complete prompt pages kept for reuse",
            "used_tokens": "pool tokens referenced by running requests",
            "host_kept_tokens": "reusable tokens in the host-memory tier",
            "lanes": "requests the engine runs at once",
            "lanes_busy": "requests running now",
        }
        lines = []
        for key, value in self.pool_stats().items():
            name = f"sparkfold_exllamav3_{key}"
            lines += [f"# HELP {name} {help_.get(key, key)}", f"# TYPE {name} gauge", f"{name} {value}"]
        return "\n".join(lines) + "\n" if lines else ""

    def _take_snapshot(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._snapshot.at < STATS_EVERY_S:
            return
        stats = self._main.generator.get_cache_stats()
        self._snapshot = _Snapshot(
            {
                "pool_tokens": int(stats.get("max_tokens", self._main.pool_tokens)),
                "free_tokens": int(stats.get("free_tokens", 0)),
                "kept_tokens": int(stats.get("cached_tokens", 0)),
                "used_tokens": int(stats.get("used_tokens", 0)),
                "host_kept_tokens": int(stats.get("tier_cached_tokens", 0)),
                "lanes": self.parallel,
                "lanes_busy": len(self._running),
            },
            now,
        )

    # --- the engine thread ----------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._take_snapshot(force=True)
            while True:
                if not self._running:
                    try:
                        first = self._inbox.get(timeout=IDLE_WAIT_S)
                    except queue.Empty:
                        self._take_snapshot()
                        continue
                    if first is None or not self._admit(first) or not self._gather():
                        break
                if not self._drain_inbox():
                    break
                self._cancel_left()
                for lane in self._lanes.values():
                    if lane.generator.num_remaining_jobs():
                        for result in lane.generator.iterate():
                            self._deliver(result)
                self._take_snapshot()
            for request in list(self._running.values()):
                self._end(request, None)
        except Exception as exc:
            log.exception("engine stopped")
            self._fail(f"engine stopped: {exc}")

    def _gather(self) -> bool:
        """Admit the rest of a burst before the first step; ``False`` when asked to stop.

        exllamav3 prefills the prompts that wait at the first step together; one that arrives a
        moment later is prefilled a step later (with a prefill cooldown, only in its turn). So an
        idle engine that just got a request keeps taking requests until none came for ``gather_s``.
        """
        if self._gather_s <= 0:
            return True
        deadline = time.monotonic() + GATHER_SPAN * self._gather_s
        while len(self._running) < self.parallel:
            wait = min(self._gather_s, deadline - time.monotonic())
            if wait <= 0:
                return True
            try:
                request = self._inbox.get(timeout=wait)
            except queue.Empty:
                return True
            if not self._admit(request):
                return False
        return True

    def _drain_inbox(self) -> bool:
        """Admit what waits; ``False`` when asked to stop."""
        while True:
            try:
                request = self._inbox.get_nowait()
            except queue.Empty:
                return True
            if request is None or not self._admit(request):
                return False

    def _admit(self, request: _Request | None) -> bool:
        if request is None:
            return False
        if len(self._running) >= self.parallel:
            request.emit(CapacityError(f"the engine runs {self.parallel} requests already"))
            return True
        lane = self._main
        if not request.params.draft and "plain" in self._lanes:
            lane = self._lanes["plain"]
        request.lane = lane.name
        try:
            prompt, embeddings = self._embed_pictures(request)
        except Exception as exc:  # the vision tower failed on this request's pictures
            log.warning("pictures refused: %s", exc)
            request.emit(EngineFailure(f"the pictures could not be read: {exc}"))
            return True
        try:
            request.job = job_for(
                self._exl,
                self._torch,
                prompt,
                request.params,
                eos_token_ids=self.eos_token_ids,
                tokenizer=lane.generator.tokenizer,
                stop_on_loop=self._stop_on_loop,
                embeddings=embeddings,
            )
            lane.generator.enqueue(request.job)
        except Exception as exc:  # a job exllamav3 refuses (too large): this request only
            log.warning("request refused by exllamav3: %s", exc)
            request.emit(CapacityError(f"the KV pool cannot take this request now: {exc}"))
            return True
        self._running[request.job] = request
        return True

    def _embed_pictures(self, request: _Request) -> tuple[Sequence[int], list[Any] | None]:
        """The prompt with picture embedding ids spliced in, and the ``MMEmbedding``s (vision tower)."""
        images = (request.params.prefill_inputs or {}).get("pixel_values")
        if not images:
            return request.prompt, None
        if self._vision is None or self._image_token is None:
            raise ValueError("this engine has no vision tower")
        tokenizer = self._main.generator.tokenizer
        embeddings = [self._vision.get_image_embeddings(tokenizer, image) for image in images]
        spans = [range(e.first_index, e.last_index) for e in embeddings]
        return splice_embeddings(request.prompt, self._image_token, spans), embeddings

    def _cancel_left(self) -> None:
        for job, request in list(self._running.items()):
            if request.cancel.is_set():
                self._lanes[request.lane].generator.cancel(job)
                self._end(request, None)

    def _deliver(self, result: dict[str, Any]) -> None:
        request = self._running.get(result.get("job"))
        if request is None:
            return
        done = bool(result.get("eos"))
        if done:  # before the last tokens: the server may end the reply on its own count of them
            report: GenerationReport = request.params.report
            report.cached_tokens = int(result.get("cached_tokens", 0))
            report.accepted = int(result.get("accepted_draft_tokens", 0))
            report.drafted = report.accepted + int(result.get("rejected_draft_tokens", 0))
            self.totals["cached"] += report.cached_tokens
            self.totals["drafted"] += report.drafted
            self.totals["accepted"] += report.accepted
        ids = result.get("token_ids")
        if ids is not None:
            for token in ids.flatten().tolist():
                request.last = int(token)
                request.emit(int(token))
        if not done:
            return
        stop = result.get("eos_triggering_token_id")
        if result.get("eos_reason") == "stop_token" and stop is not None and request.last != stop:
            request.emit(int(stop))  # exllamav3 holds the stop token back; the server ends on it
        self._end(request, None)

    def _end(self, request: _Request, error: BaseException | None) -> None:
        self._running.pop(request.job, None)
        request.emit(error)

    def _fail(self, message: str) -> None:
        self._fatal = message
        for request in list(self._running.values()):
            self._end(request, EngineFailure(message))
        while True:
            try:
                queued = self._inbox.get_nowait()
            except queue.Empty:
                break
            if queued is not None:
                queued.emit(EngineFailure(message))
        if self._on_fatal is not None:
            self._on_fatal(message)


# --- loading ------------------------------------------------------------------------------------


@dataclass
class Loaded:
    """What :func:`load` hands back."""

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
    from sparkfold.glm.media import MediaLimits
    from sparkfold.glm.serving import GlmChat, is_glm_model

    root = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    if not is_glm_model(root):
        return None
    return GlmChat(
        tokenizer,
        model_dir=directory,
        vocab_size=vocab_size,
        image_processor=preprocessor,
        has_vision=preprocessor is not None,
        limits=MediaLimits.from_settings(settings.media),
        default_thinking=settings.thinking,
        model_name=settings.served_name,
    )


def load(settings: EngineSettings, on_fatal: Callable[[str], None] | None = None) -> Loaded:
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
    exl_tokenizer = exl.Tokenizer.from_config(config)
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
    }
    return Loaded(generator, pool, time.monotonic() - started, plan)
