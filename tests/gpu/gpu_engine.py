"""Helpers of the GPU tests: an engine process on the GPU, and the numbers a run measured."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

from tests.integration.engine_procs import RUNTIME, EngineProcess, free_port, wait_healthy, write_config

from sparkfold.engines.compile_cache import CACHES


class Results:
    """Measured numbers of this run, written to ``$SPARKFOLD_GPU_OUT/gpu_results.json``."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}

    def record(self, key: str, value: Any) -> None:
        self.values[key] = value
        out = os.environ.get("SPARKFOLD_GPU_OUT")
        if out:
            Path(out).mkdir(parents=True, exist_ok=True)
            (Path(out) / "gpu_results.json").write_text(json.dumps(self.values, indent=2) + "\n")


VIDEO_LIMITS = {"max_video_frames": 80, "max_video_tokens": 32}
"""``[engine.media]`` of the shared engines: small enough that a test clip passes each limit."""


def child_env() -> dict[str, str]:
    """The engine child keeps this process's PYTHONPATH (carried wheels, the extension build)."""
    paths = [str(RUNTIME), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {"PYTHONPATH": os.pathsep.join(paths)}


def start_engine(
    tmp: Path,
    model: Path,
    name: str,
    *,
    served_name: str = "glm",
    parallel: int = 4,
    context: int = 16_384,
    core_process: bool | None = None,
    media: dict[str, Any] | None = None,
    cache_dir: Path | None = None,
    **exllamav3: Any,
) -> tuple[str, EngineProcess]:
    """``sparkfold engine`` on the GPU with these ``[engine.exllamav3]`` keys; its URL once healthy.

    ``core_process``: ``[engine] core_process``; None leaves it to the default (on for one GPU).
    ``media``: ``[engine.media]`` keys; ``cache_dir``: ``[paths] cache_dir`` (its compile caches)."""
    port = free_port()
    tp = int(exllamav3.pop("tp", 1))
    config = write_config(
        tmp / f"{name}.toml",
        model,
        kind="exllamav3",
        port=port,
        served_name=served_name,
        context=context,
        max_tokens=64,
        parallel=parallel,
        thinking=False,
        tp=tp,
        **({} if core_process is None else {"core_process": core_process}),
    )
    for section, keys in (("exllamav3", exllamav3), ("media", media or {})):
        if keys:
            lines = [f"[engine.{section}]"] + [f"{key} = {json.dumps(value)}" for key, value in keys.items()]
            config.write_text(config.read_text() + "\n".join(lines) + "\n")
    if cache_dir is not None:
        config.write_text(config.read_text() + f'[paths]\ncache_dir = "{cache_dir}"\n')
    log_dir = Path(os.environ.get("SPARKFOLD_GPU_OUT") or tmp)
    env: dict[str, str | None] = {**child_env()}
    if cache_dir is not None:  # the engine points its compile caches into cache_dir, not ours
        env |= dict.fromkeys(CACHES)
    proc = EngineProcess(config, log_dir / f"engine-{name}.log", env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, deadline_s=400)
    except BaseException:
        proc.stop()
        raise
    return url, proc


WORDS = ["amber", "basalt", "cinder", "delta", "ember", "fjord", "granite", "harbor", "iris", "jade"]


def text_of(tokenizer: Any, tokens: int, seed: int) -> str:
    """Random words that ``tokenizer`` reads as ``tokens`` tokens (a few more or less where the cut is
    read again); another ``seed``, another text (no shared prefix)."""
    rng = random.Random(seed)

    def words(count: int) -> str:
        return " ".join(rng.choice(WORDS) + str(rng.randrange(100)) for _ in range(count))

    per_word = len(tokenizer.encode(words(2_000), add_special_tokens=False)) / 2_000
    ids = tokenizer.encode(f"{seed}: " + words(int(tokens / per_word * 1.05) + 16), add_special_tokens=False)
    return str(tokenizer.decode(ids[:tokens]))
