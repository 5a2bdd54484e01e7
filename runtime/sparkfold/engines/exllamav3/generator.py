"""The exllamav3 engine thread: requests in, token ids out, over one paged KV pool.

Up to ``parallel`` requests run as exllamav3 jobs at once over the one pool; exllamav3 batches
their steps, reuses cached prompt pages (and recurrent-state checkpoints of the KDA layers) and
drafts tokens when drafts are configured. With drafts on, a second, undrafted lane (its own small
pool over the same weights) serves requests that ask for ``"draft": false``. The scheduling loop
is :class:`~sparkfold.engines.threaded.ThreadedEngine`'s; this module maps its steps onto
exllamav3's ``enqueue`` / ``iterate`` / ``cancel``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sparkfold.engines.exllamav3.jobs import job_for
from sparkfold.engines.exllamav3.logprobs import LOG_ZERO, token_logprobs
from sparkfold.engines.exllamav3.vision import embed_video, prompt_spans, splice_embeddings
from sparkfold.engines.generator import CapacityError, EngineFailure, GenerationReport, TokenLogprob
from sparkfold.engines.threaded import Job, ThreadedEngine
from sparkfold.glm.tokens import BEGIN_OF_VIDEO, END_OF_VIDEO, IMAGE

__all__ = ["Exllamav3Generator", "Lane"]

log = logging.getLogger(__name__)

STATS_EVERY_S = 0.5
FATAL_AFTER = 3
"""Steps in a row that raise before the engine gives up (one failing request fails only its lane)."""


@dataclass(eq=False)
class _LaneJob(Job):
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


class Exllamav3Generator(ThreadedEngine[_LaneJob]):
    """Requests in, token ids out: one engine thread drives exllamav3's generator(s)."""

    backend = "exllamav3"
    job_type = _LaneJob
    supports_logprobs = True
    """From exllamav3's own per-token probabilities (:mod:`~sparkfold.engines.exllamav3.logprobs`)."""

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
        self._video_markers = (-1, -1)
        if vision is not None:
            self._image_token = int(tokenizer.convert_tokens_to_ids(IMAGE))
            self._video_markers = (
                int(tokenizer.convert_tokens_to_ids(BEGIN_OF_VIDEO)),
                int(tokenizer.convert_tokens_to_ids(END_OF_VIDEO)),
            )
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
        self.gather_s = gather_s
        self._on_fatal = on_fatal
        self._running: dict[Any, _LaneJob] = {}
        self._lane_failures = 0
        self._snapshot = _Snapshot()
        self.totals = {"drafted": 0, "accepted": 0, "cached": 0}
        self._take_snapshot(force=True)
        self._start(tokenizer)

    def close(self) -> None:
        """Stop the engine thread (ending what still runs) and release exllamav3's workers."""
        super().close()
        for lane in self._lanes.values():
            try:
                lane.generator.close()  # exllamav3's Generator.close (generator/generator.py)
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

    # --- the engine thread (the loop is ThreadedEngine's) ----------------------------------------

    def _begin(self, request: _LaneJob) -> BaseException | None:
        lane = self._main
        if not request.params.draft and "plain" in self._lanes:
            lane = self._lanes["plain"]
        request.lane = lane.name
        try:
            prompt, embeddings = self._embed_pictures(request)
        except Exception as exc:  # the vision tower failed on this request's pictures
            log.warning("pictures refused: %s", exc)
            return EngineFailure(f"the pictures could not be read: {exc}")
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
            return CapacityError(f"the KV pool cannot take this request now: {exc}")
        self._running[request.job] = request
        return None

    def _step(self) -> None:
        for lane in self._lanes.values():
            if lane.generator.num_remaining_jobs():
                try:
                    results = lane.generator.iterate()
                except Exception as exc:
                    self._fail_lane(lane, exc)
                    continue
                self._lane_failures = 0
                for result in results:
                    self._deliver(result)

    def _fail_lane(self, lane: Lane, exc: Exception) -> None:
        """A step raised: exllamav3 does not say which job caused it, so every request on that
        lane fails, the engine goes on. Only failures in :data:`FATAL_AFTER` steps in a row (the
        device, not a request, is broken) end the engine."""
        self._lane_failures += 1
        if self._lane_failures >= FATAL_AFTER:
            raise exc
        log.exception("a step of the %s lane failed; its requests fail, the engine goes on", lane.name)
        for request in [r for r in self._running.values() if r.lane == lane.name]:
            try:
                lane.generator.cancel(request.job)
            except Exception:  # the job may be gone already
                log.debug("cancelling a failed job", exc_info=True)
            self._end(request, EngineFailure(f"generation failed: {exc}"))

    def _cancel(self, request: _LaneJob) -> None:
        self._lanes[request.lane].generator.cancel(request.job)

    def _release(self, request: _LaneJob) -> None:
        self._running.pop(request.job, None)

    def _idle(self) -> None:
        self._take_snapshot()

    def _after_step(self) -> None:
        self._take_snapshot()

    def _embed_pictures(self, request: _LaneJob) -> tuple[Sequence[int], list[Any] | None]:
        """The prompt with the embedding ids of its pictures and clips spliced in, and their
        ``MMEmbedding``s (the vision tower's; one per picture, one per clip)."""
        inputs = request.params.prefill_inputs or {}
        images = inputs.get("pixel_values") or []
        clips = inputs.get("pixel_values_videos") or []
        if not images and not clips:
            return request.prompt, None
        if self._vision is None or self._image_token is None:
            raise ValueError("this engine has no vision tower")
        tokenizer = self._main.generator.tokenizer
        pictures = [self._vision.get_image_embeddings(tokenizer, image) for image in images]
        videos = [embed_video(self._vision, self._torch, self._exl.MMEmbedding, frames) for frames in clips]
        spans = prompt_spans(
            request.prompt,
            self._image_token,
            *self._video_markers,
            [range(e.first_index, e.last_index) for e in pictures],
            [groups for _, groups in videos],
        )
        embeddings = [*pictures, *(embedding for embedding, _ in videos)]
        return splice_embeddings(request.prompt, self._image_token, spans), embeddings

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
            report.phases_s = {
                phase: float(result[f"time_{key}"])
                for phase, key in (("queued", "enqueued"), ("prefill", "prefill"), ("generate", "generate"))
                if f"time_{key}" in result
            }
            self.totals["cached"] += report.cached_tokens
            self.totals["drafted"] += report.drafted
            self.totals["accepted"] += report.accepted
        ids = result.get("token_ids")
        wants = request.params.logprobs is not None
        entries = token_logprobs(result) if wants else []
        if ids is not None:
            for index, token in enumerate(ids.flatten().tolist()):
                if wants:  # before the token: the server reads its entry when the token arrives
                    request.params.logprobs_out.append(entries[index])
                request.last = int(token)
                request.emit(int(token))
        if not done:
            return
        constraint = request.params.constraint
        dead_end = None if constraint is None else constraint.dead_end
        if dead_end is not None:  # the filter offered the stops only: the reply ends with the error
            self._end(request, dead_end)
            return
        stop = result.get("eos_triggering_token_id")
        if result.get("eos_reason") == "stop_token" and stop is not None and request.last != stop:
            if wants:  # the stop token's probabilities are in the held block, with the token
                held = token_logprobs(result.get("held") or {})
                request.params.logprobs_out.append(held[-1] if held else TokenLogprob(int(stop), LOG_ZERO))
            request.emit(int(stop))  # exllamav3 holds the stop token back; the server ends on it
        self._end(request, None)
