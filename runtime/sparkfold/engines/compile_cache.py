"""Compile caches in the node's cache directory (``[paths] cache_dir``), so a restart loads without compiling
(or converting).

An engine's first start on a machine compiles: Triton's kernels (and, with ``cache_results``, its
autotuner's choices), exllamav3's cooperative GEMM autotuner, torch's inductor. Each keeps its
results on disk where an environment variable says, by default under ``~/.cache`` or ``/tmp``,
which a systemd unit's private or fresh ``/tmp`` and a changing ``$HOME`` lose:

- ``TRITON_CACHE_DIR``: Triton's compiled kernels and autotuning results (triton/runtime/cache.py);
- ``TORCHINDUCTOR_CACHE_DIR``: torch inductor's (torch/_inductor/runtime/cache_dir_utils.py);
- ``EXLLAMAV3_TUNE_CACHE``: exllamav3's cooperative GEMM autotuner, ``coop_autotune_v1.bin`` in
  that directory (``disk_cache_path`` in exllamav3_ext/quant/coop_autotune.cu, 1.6.5);
- ``SPARKFOLD_GGUF_CACHE``: the CPU engine's GGUF model, dequantized once
  (:mod:`sparkfold.engines.transformers.gguf_cache`).

:func:`use_compile_caches` points each at ``<cache_dir>/compile-cache/<name>`` (a variable already
set is left as set), before the engine imports any of them (an engine core inherits the
environment), and says whether this is a first start or a restart: a restart finds something
cached.
"""

from __future__ import annotations

import logging
import os
from collections.abc import MutableMapping
from pathlib import Path

__all__ = ["CACHES", "use_compile_caches"]

log = logging.getLogger(__name__)

CACHES = {
    "TRITON_CACHE_DIR": "triton",
    "TORCHINDUCTOR_CACHE_DIR": "inductor",
    "EXLLAMAV3_TUNE_CACHE": "exllamav3",
    "SPARKFOLD_GGUF_CACHE": "gguf",
}


def use_compile_caches(cache_dir: Path, env: MutableMapping[str, str] | None = None) -> str:
    """Point the compilers' caches into ``cache_dir``; ``"restart"`` when any of them already held
    something, else ``"first"``. A folder that cannot be made leaves that cache at its default."""
    env = os.environ if env is None else env
    warm = False
    for variable, name in CACHES.items():
        folder = Path(env.get(variable) or cache_dir / "compile-cache" / name)
        try:
            folder.mkdir(parents=True, exist_ok=True)  # exllamav3 takes a missing path for a file name
        except OSError as exc:
            log.warning("compile cache %s stays at its default: %s", variable, exc)
            continue
        env.setdefault(variable, str(folder))
        warm = warm or any(folder.iterdir())
    return "restart" if warm else "first"
