"""A stand-in for exllamav3's generator whose steps cost CPU time the way a small model's do.

On a model small enough that the GPU waits for Python, each ``Generator.iterate()`` is mostly
Python holding the GIL (kernel launches, per-job bookkeeping, sampling) and partly a wait with the
GIL released (a CUDA synchronisation). :class:`BusyGenerator` reproduces that shape on a CPU:
every step spins for ``step_s × gil_share`` (GIL held), then sleeps for the rest (GIL free), and
gives every running job one token. It also follows exllamav3's prefill rule: waiting prompts all
start together while nothing generates; once something does, they still all start at the next
step when ``prefill_cooldown`` is 0 and the shared chunk is a full chunk, and otherwise one prompt
starts every ``prefill_cooldown + 1`` steps. The reply is the prompt's tokens again, in order
(real text).

``BUSY_EXL`` is the slice of the ``exllamav3`` module our engine uses (``Job``, samplers,
``Filter``), so :class:`sparkfold.engines.exllamav3.Exllamav3Generator` runs on it as
it would on the real one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch

__all__ = ["BUSY_EXL", "BusyGenerator", "BusyJob", "spin"]


def spin(seconds: float) -> None:
    """Keep this thread running Python (holding the GIL, bar the interpreter's switches)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


@dataclass(eq=False)
class BusyJob:
    input_ids: Any
    max_new_tokens: int
    stop_conditions: list[int] = field(default_factory=list)
    produced: int = 0

    @classmethod
    def make(cls, input_ids: Any, **kwargs: Any) -> BusyJob:
        """``exllamav3.Job(input_ids, max_new_tokens=…, stop_conditions=…, …)``; the rest is ignored."""
        return cls(input_ids, kwargs["max_new_tokens"], list(kwargs.get("stop_conditions", [])))

    def next_token(self) -> int:
        prompt = self.input_ids[0]
        token = int(prompt[self.produced % len(prompt)])
        self.produced += 1
        return token


class _Filter:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass


BUSY_EXL = SimpleNamespace(
    Job=BusyJob.make,
    ArgmaxSampler=lambda: "argmax",
    ComboSampler=lambda **kwargs: ("combo", kwargs),
    Filter=_Filter,
)


class BusyGenerator:
    """``enqueue`` / ``iterate`` / ``cancel`` like exllamav3's ``Generator``, at a set cost per step."""

    def __init__(
        self,
        step_s: float,
        gil_share: float,
        max_batch: int,
        prefill_cooldown: int = 0,
        shared_chunk_full: bool = True,
    ) -> None:
        self.step_s = step_s
        self.gil_share = gil_share
        self.max_batch = max_batch
        self.prefill_cooldown = prefill_cooldown
        self.one_at_a_time = prefill_cooldown > 0 or not shared_chunk_full
        self.tokenizer = None
        self.pending: list[BusyJob] = []
        self.active: list[BusyJob] = []
        self._cooldown_left = 0

    def enqueue(self, job: BusyJob | list[BusyJob]) -> None:
        self.pending.extend(job if isinstance(job, list) else [job])

    def cancel(self, job: BusyJob) -> None:
        for jobs in (self.pending, self.active):
            if job in jobs:
                jobs.remove(job)

    def num_remaining_jobs(self) -> int:
        return len(self.pending) + len(self.active)

    def get_cache_stats(self) -> dict[str, int]:
        return {"max_tokens": 65_536, "free_tokens": 65_536, "cached_tokens": 0, "used_tokens": 0}

    def _start_jobs(self) -> None:
        room = self.max_batch - len(self.active)
        if not self.active or not self.one_at_a_time:
            started, self.pending = self.pending[:room], self.pending[room:]
        elif self.pending and room > 0 and self._cooldown_left == 0:
            started = [self.pending.pop(0)]
            self._cooldown_left = self.prefill_cooldown
        else:
            self._cooldown_left = max(0, self._cooldown_left - 1)
            started = []
        self.active += started

    def iterate(self) -> list[dict[str, Any]]:
        self._start_jobs()
        if not self.active:
            return []
        spin(self.step_s * self.gil_share)
        time.sleep(self.step_s * (1 - self.gil_share))
        results = []
        for job in list(self.active):
            token = job.next_token()
            result: dict[str, Any] = {"job": job, "eos": False}
            if token in job.stop_conditions:
                result |= {"eos": True, "eos_reason": "stop_token", "eos_triggering_token_id": token}
            else:
                result["token_ids"] = torch.tensor([[token]])
                if job.produced >= job.max_new_tokens:
                    result |= {"eos": True, "eos_reason": "max_new_tokens"}
            if result["eos"]:
                self.active.remove(job)
            results.append(result)
        return results
