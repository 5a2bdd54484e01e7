"""The ``transformers`` engine: a Hugging Face causal LM on CPU, one or two ranks.

:func:`load` resolves the model (a local HF directory, a ``.gguf`` file, or the demo name
``smollm2``), loads it, and for ``tp = 2`` splits its MLPs across the ranks. Rank 0 gets a
:class:`TransformersGenerator` (the :class:`~sparkfold.engines.generator.Generator` the server
uses); rank 1 gets a :class:`ModelRunner` and calls :meth:`ModelRunner.follow`.

Scheduling: one engine thread owns the model. Up to ``parallel`` requests are active, each with
its own KV cache; the thread runs one step of each in turn (a prompt chunk of up to
``prefill_chunk_tokens`` while the prompt is read, then one token), so requests interleave while
every forward stays a batch of one: a request's tokens are exactly what it would get alone, and
a long prompt holds the other streams for one chunk's forward per step, not its whole prefill.
"""

from __future__ import annotations

import inspect
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from sparkfold.config import EngineSettings
from sparkfold.engines.generator import EngineFailure
from sparkfold.engines.models import ModelSource, resolve_model
from sparkfold.engines.threaded import EngineBroken, Job, ThreadedEngine
from sparkfold.engines.transformers.gguf_cache import converted_folder, keep
from sparkfold.engines.transformers.lanes import SlotCache
from sparkfold.engines.transformers.sampling import sample, token_logprob
from sparkfold.engines.transformers.tensor_parallel import Link, Op, Rendezvous, meet, split_mlps

__all__ = ["LoadedRank", "ModelRunner", "TransformersGenerator", "load"]

log = logging.getLogger(__name__)

KEEPALIVE_S = 60.0  # an idle rank 0 sends rank 1 a no-op this often (gloo ops time out otherwise)


def _is_glm_checkpoint(source: ModelSource) -> bool:
    from sparkfold.glm.chat import is_glm_model

    config = Path(source.path) / "config.json"
    if source.gguf_file or not config.is_file():
        return False
    return is_glm_model(json.loads(config.read_text(encoding="utf-8")))


def _extra(source: ModelSource) -> dict[str, Any]:
    return {"gguf_file": source.gguf_file} if source.gguf_file else {}


def _load_tokenizer(source: ModelSource) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(source.path, **_extra(source))


def _readable(settings: EngineSettings, source: ModelSource) -> tuple[ModelSource, Path | None]:
    """What to read: ``source``, or the converted copy of its GGUF file where one is kept
    (gguf_cache.py); and the folder a GGUF file's conversion is to be kept in, if any."""
    folder = converted_folder(source, settings.transformers.dtype)
    if folder is not None and folder.is_dir():
        return ModelSource(folder), None
    return source, folder


def _load_weights(settings: EngineSettings, source: ModelSource) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    read, keep_in = _readable(settings, source)
    tokenizer = _load_tokenizer(read)
    auto = AutoModelForImageTextToText if _is_glm_checkpoint(read) else AutoModelForCausalLM
    model = auto.from_pretrained(read.path, dtype=getattr(torch, settings.transformers.dtype), **_extra(read))
    if keep_in is not None:
        keep(keep_in, model, tokenizer)
    model.eval()
    return model, tokenizer


def server_side(settings: EngineSettings) -> tuple[Any, Any]:
    """What the HTTP side of an engine core needs, without the weights: the tokenizer, the GLM protocol."""
    from transformers import AutoConfig

    source = resolve_model(settings.model, settings.transformers.gguf_file)
    tokenizer = _load_tokenizer(_readable(settings, source)[0])
    if not _is_glm_checkpoint(source):
        return tokenizer, None
    return tokenizer, _glm_chat(settings, source, AutoConfig.from_pretrained(source.path), tokenizer)


def _glm_chat(settings: EngineSettings, source: ModelSource, config: Any, tokenizer: Any) -> Any:
    """The GLM protocol for a GLM checkpoint (``sparkfold.glm.chat.GlmChat``), else ``None``."""
    from sparkfold.glm.chat import GlmChat, is_glm_model

    if not is_glm_model(config):
        return None
    has_vision = getattr(config, "vision_config", None) is not None
    image_processor = video_processor = None
    if has_vision:
        from transformers import AutoImageProcessor

        image_processor = AutoImageProcessor.from_pretrained(source.path)
        try:
            from transformers import AutoVideoProcessor

            video_processor = AutoVideoProcessor.from_pretrained(source.path)
        except (ImportError, ValueError, OSError) as exc:  # torchvision missing: images only
            log.warning("video input disabled: %s", str(exc).strip().splitlines()[0])
    text = getattr(config, "text_config", config)
    return GlmChat.for_engine(
        settings,
        tokenizer,
        model_dir=source.path,
        vocab_size=text.vocab_size,
        image_processor=image_processor,
        video_processor=video_processor,
        has_vision=has_vision,
    )


def _constrained(logits: torch.Tensor, constraint: Any, last: int | None) -> torch.Tensor:
    """``logits`` with the tokens ``constraint`` forbids set to -inf (``last`` is fed to it first)."""
    from sparkfold.glm.grammar import allocate_bitmask, apply_bitmask

    if last is not None and not constraint.is_terminated():
        constraint.accept_token(last)
    mask = allocate_bitmask(constraint.vocab_size)
    if not constraint.fill_bitmask(mask, 0):
        return logits
    masked = logits.clone().unsqueeze(0)
    apply_bitmask(masked, mask)
    return masked[0]


class ModelRunner:
    """Forwards with one KV cache per slot (a :class:`SlotCache`, kept between requests for prefix
    reuse); on two ranks, rank 0 announces each step to rank 1, which mirrors it on its own lanes."""

    def __init__(self, model: Any, link: Link | None = None, *, block: int = 0, keep_tokens: int = 0) -> None:
        self.model = model
        self.link = link
        self.block = block
        """Prompt tokens per chunk: reuse resumes at the end of a whole one (0: no reuse)."""
        self.keep_tokens = keep_tokens
        """Tokens a lane keeps for the next request (0: no reuse)."""
        self._lanes: dict[int, SlotCache] = {}
        # transformers 5.2x renamed ``past_key_values`` to ``cache`` (the old name warns)
        self._cache_arg = (
            "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        )

    def _new_cache(self) -> Any:
        from transformers import DynamicCache

        return DynamicCache(config=self.model.config)

    def reusable(self, slot: int, prompt: Sequence[int]) -> int:
        """Prompt tokens ``slot``'s kept cache stands for (0: none)."""
        lane = self._lanes.get(slot)
        return lane.reusable(prompt) if lane is not None else 0

    def kept(self, slot: int) -> int:
        """Tokens ``slot``'s cache holds."""
        lane = self._lanes.get(slot)
        return len(lane.ids) if lane is not None else 0

    def open(self, slot: int, keep: int = 0) -> None:
        """Start a request in ``slot`` with the first ``keep`` tokens of its kept cache (0: a new one)."""
        if self.link and self.link.rank == 0:
            self.link.send_step(Op.OPEN, slot, [keep])
        self._open(slot, keep)

    def _open(self, slot: int, keep: int) -> None:
        lane = self._lanes.get(slot)
        if lane is None:
            lane = self._lanes[slot] = SlotCache(
                self._new_cache, block=self.block, keep_tokens=self.keep_tokens
            )
        lane.keep(keep)

    def close(self, slot: int) -> None:
        if self.link and self.link.rank == 0:
            self.link.send_step(Op.CLOSE, slot)
        self._close(slot)

    def _close(self, slot: int) -> None:
        lane = self._lanes.get(slot)
        if lane is not None:
            lane.release()

    def keepalive(self) -> None:
        if self.link:
            self.link.send_step(Op.NOOP)

    def stop(self) -> None:
        if self.link:
            self.link.send_step(Op.STOP)

    @torch.inference_mode()
    def forward(self, slot: int, ids: Sequence[int], extra: Mapping[str, Any] | None = None) -> torch.Tensor:
        """Feed ``ids`` (and ``extra`` inputs, e.g. pixels) into ``slot``'s cache; the next-token logits."""
        if self.link and self.link.rank == 0:
            if extra:
                raise EngineFailure("extra model inputs (pictures) need tp = 1")
            self.link.send_step(Op.FORWARD, slot, list(ids))
        logits = self._feed(slot, ids, extra)
        assert logits is not None
        return logits

    def _feed(
        self, slot: int, ids: Sequence[int], extra: Mapping[str, Any] | None = None, *, logits: bool = True
    ) -> torch.Tensor | None:
        """Run the model on ``ids`` over ``slot``'s cache; the next-token logits (rank 1 needs none)."""
        lane = self._lanes[slot]
        inputs = torch.tensor([list(ids)], dtype=torch.long)
        cache = {self._cache_arg: lane.cache}
        try:
            if logits:
                out = self.model(input_ids=inputs, **cache, use_cache=True, logits_to_keep=1, **(extra or {}))
            else:
                self.model.get_decoder()(input_ids=inputs, **cache, use_cache=True)
        except BaseException:
            lane.keep(0)  # some layers may have taken the tokens and others not
            raise
        lane.fed(ids)
        if extra:
            lane.unmarked()
        return out.logits[0, -1] if logits else None

    @torch.inference_mode()
    def follow(self) -> None:
        """Rank 1: mirror rank 0's steps until it says stop. Raises :class:`EngineFailure`."""
        assert self.link is not None and self.link.rank == 1
        while True:
            try:
                op, slot, ids = self.link.receive_step()
            except RuntimeError as exc:
                raise EngineFailure(f"lost rank 0: {exc}") from exc
            if op is Op.STOP:
                return
            if op is Op.OPEN:
                self._open(slot, ids[0] if ids else 0)
            elif op is Op.CLOSE:
                self._close(slot)
            elif op is Op.FORWARD:
                self._feed(slot, ids, logits=False)


@dataclass(eq=False)
class _Job(Job):
    slot: int = -1
    fed: int = 0  # prompt tokens in the KV cache
    produced: int = 0
    last: int | None = None
    rng: torch.Generator | None = field(default=None, repr=False)


class TransformersGenerator(ThreadedEngine[_Job]):
    """Rank 0's generator: requests in, token ids out, one engine thread."""

    backend = "transformers"
    supports_logprobs = True
    job_type = _Job

    def __init__(
        self,
        runner: ModelRunner,
        tokenizer: Any,
        *,
        context_length: int,
        parallel: int,
        on_fatal: Callable[[str], None] | None = None,
        glm: Any = None,
        prefill_chunk_tokens: int = 0,
    ) -> None:
        self._runner = runner
        self.prefill_chunk_tokens = prefill_chunk_tokens
        """Prompt tokens per forward while a prompt is read (0: the whole prompt in one)."""
        self.tp = 2 if runner.link is not None else 1
        self.glm = glm
        """``sparkfold.glm.chat.GlmChat`` for a GLM checkpoint (the server then speaks GLM)."""
        self.context_length = context_length
        self.parallel = parallel
        self._on_fatal = on_fatal
        self.eos_token_ids = _eos_ids(runner.model, tokenizer)
        self.vocab_size = int(runner.model.get_input_embeddings().num_embeddings)
        self._free = list(range(parallel))
        self.idle_wait_s = KEEPALIVE_S
        self._start(tokenizer)

    # --- the engine thread (the loop is ThreadedEngine's) ----------------------------------------

    def _begin(self, job: _Job) -> BaseException | None:
        try:  # what one request's parameters do here fails that request, not the engine
            rng = None if job.params.greedy else torch.Generator().manual_seed(job.params.seed)
        except (RuntimeError, ValueError, OverflowError) as exc:
            log.warning("request refused at admission: %s", exc)
            return EngineFailure(f"the request's sampling parameters were refused: {exc}")
        job.rng = rng
        slot, keep = self._lane_for(job)
        self._free.remove(slot)
        try:
            self._runner.open(slot, keep)
        except Exception as exc:
            self._free.append(slot)  # never opened: the next request may take it
            if self._runner.link is not None:  # the ranks may be out of step now: stop, the supervisor exits
                raise EngineBroken(f"opening a slot on both ranks failed: {exc}") from exc
            raise
        job.slot = slot
        job.fed = keep
        job.params.report.cached_tokens = keep
        return None

    def _lane_for(self, job: _Job) -> tuple[int, int]:
        """The free slot whose kept cache stands for most of the prompt, and how many tokens; among
        equals the one that keeps least (what the others keep stays for the requests it suits)."""
        reuse = {
            slot: 0 if job.params.prefill_inputs else self._runner.reusable(slot, job.prompt)
            for slot in self._free
        }  # pictures: their placeholder tokens say nothing of the pixels
        slot = max(self._free, key=lambda s: (reuse[s], -self._runner.kept(s)))
        return slot, reuse[slot]

    def _step(self) -> None:
        for job in list(self._active):
            try:
                self._step_one(job)
            except Exception as exc:
                if self._runner.link is not None:
                    raise  # the ranks may be out of step now: stop, the supervisor exits
                log.exception("request failed")
                self._end(job, exc)

    def _step_one(self, job: _Job) -> None:
        if job.last is None and job.params.prefill_inputs:  # pictures: their features need the whole prompt
            logits = self._runner.forward(job.slot, job.prompt, job.params.prefill_inputs)
        elif job.last is None:  # the prompt, a chunk per step
            chunk = self.prefill_chunk_tokens or len(job.prompt)
            end = min(job.fed + chunk, len(job.prompt))
            logits = self._runner.forward(job.slot, job.prompt[job.fed : end])
            job.fed = end
            if end < len(job.prompt):
                return
        else:
            logits = self._runner.forward(job.slot, [job.last])
        raw = logits
        if job.params.constraint is not None:
            logits = _constrained(logits, job.params.constraint, job.last)
            if job.params.constraint.dead_end is not None:  # nothing to sample: the reply ends
                self._end(job, job.params.constraint.dead_end)
                return
        token = sample(logits, job.params, job.rng)
        if job.params.logprobs is not None:
            job.params.logprobs_out.append(token_logprob(raw, token, job.params.logprobs))
        job.produced += 1
        job.last = token
        job.emit(token)
        params = job.params
        ended = (token in self.eos_token_ids and not params.ignore_eos) or token in params.stop_token_ids
        if ended or job.produced >= params.max_tokens:
            self._end(job, None)

    def _release(self, job: _Job) -> None:
        self._runner.close(job.slot)
        self._free.append(job.slot)

    def _idle(self) -> None:
        self._runner.keepalive()

    def _shutdown(self) -> None:
        self._runner.stop()


def _eos_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    ids: set[int] = set()
    configured = getattr(model.generation_config, "eos_token_id", None)
    if isinstance(configured, int):
        ids.add(configured)
    elif configured:
        ids.update(configured)
    if isinstance(tokenizer.eos_token_id, int):
        ids.add(tokenizer.eos_token_id)
    return frozenset(ids)


@dataclass
class LoadedRank:
    """What :func:`load` hands back: rank 0 serves ``generator``; rank 1 runs ``runner.follow()``."""

    source: ModelSource
    runner: ModelRunner
    generator: TransformersGenerator | None
    load_s: float


def load(
    settings: EngineSettings,
    rank: int = 0,
    meeting: Rendezvous | None = None,
    on_fatal: Callable[[str], None] | None = None,
) -> LoadedRank:
    """Load the model; with ``tp = 2`` meet the peer first (settings check), then split and link.

    Raises :class:`~sparkfold.engines.transformers.tensor_parallel.EngineMismatch` when the ranks disagree,
    :class:`FileNotFoundError` when the model cannot be found.
    """
    started = time.monotonic()
    source = resolve_model(settings.model, settings.transformers.gguf_file)
    joined = meet(meeting, settings) if settings.tp > 1 and meeting is not None else None
    if settings.transformers.threads:
        torch.set_num_threads(settings.transformers.threads)
    model, tokenizer = _load_weights(settings, source)
    link = None
    if joined is not None:
        link = joined.link()
        split_mlps(model, link)
    runner = ModelRunner(
        model,
        link,
        block=settings.transformers.prefill_chunk_tokens,
        keep_tokens=settings.transformers.prefix_cache_tokens,
    )
    generator = None
    if rank == 0:
        window = getattr(model.config, "max_position_embeddings", None) or settings.context
        if window < settings.context:
            log.warning(
                "engine.context %d exceeds the model's %d positions; using %d",
                settings.context,
                window,
                window,
            )
        generator = TransformersGenerator(
            runner,
            tokenizer,
            context_length=min(settings.context, window),
            parallel=settings.parallel,
            on_fatal=on_fatal,
            glm=_glm_chat(settings, source, model.config, tokenizer),
            prefill_chunk_tokens=settings.transformers.prefill_chunk_tokens,
        )
    return LoadedRank(source, runner, generator, time.monotonic() - started)
