"""A GGUF model dequantized once per node, not at every start of the CPU engine.

transformers reads a GGUF file by dequantizing every tensor with NumPy at each load
(``load_gguf_checkpoint`` in ``transformers/modeling_gguf_pytorch_utils.py``) and rebuilds the
tokenizer from the file's metadata: 40-60 s of CPU for the 135M-parameter demo model on a testbed
node, paid again by every restart. With ``SPARKFOLD_GGUF_CACHE`` set (the engine's start points it
at ``<paths.cache_dir>/compile-cache/gguf``, :mod:`sparkfold.engines.compile_cache`), the first load
saves what it read, model and tokenizer (:func:`~sparkfold.engines.models.save_plain`: safetensors
at the engine's dtype), into a folder named after the file, its size and modification time, the
dtype and the transformers version; later loads read that folder instead (seconds), the same weights
bit for bit. A changed file (the weights stage repairs or replaces it) gets a folder of its own and
the older folder of that file name goes. A folder is written under a temporary name and renamed when
complete, so a start cut short leaves nothing a later one would read; a folder that cannot be
written only costs the next start its conversion (a warning says why).

transformers has no such cache of its own (its GGUF loader keeps nothing); hence this module.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from sparkfold.engines.models import ModelSource, save_plain

__all__ = ["ENV", "converted_folder", "keep"]

log = logging.getLogger(__name__)

ENV = "SPARKFOLD_GGUF_CACHE"
_PARTIAL = ".partial-"


def converted_folder(source: ModelSource, dtype: str) -> Path | None:
    """Where the converted copy of ``source`` is kept; ``None`` for a model that is no GGUF file or
    when no cache is set. The folder may not exist yet."""
    root = os.environ.get(ENV)
    if not root or not source.gguf_file:
        return None
    import transformers

    file = (Path(source.path) / source.gguf_file).resolve()
    stat = file.stat()
    identity = f"{file}|{stat.st_size}|{stat.st_mtime_ns}|{dtype}|transformers {transformers.__version__}"
    return Path(root) / f"{file.stem}-{hashlib.sha256(identity.encode()).hexdigest()[:16]}"


def keep(folder: Path, model: Any, tokenizer: Any) -> None:
    """Save ``model`` and ``tokenizer`` (as read from the GGUF file) as ``folder``, atomically, and
    remove the folders of earlier versions of the same file; a failure is logged, never raised."""
    partial = folder.with_name(f"{folder.name}{_PARTIAL}{os.getpid()}")
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        save_plain(model, tokenizer, partial)
        if folder.is_dir():  # another process of this start (the engine core's server side) was first
            shutil.rmtree(partial, ignore_errors=True)
            return
        partial.rename(folder)
    except (OSError, ValueError) as exc:
        log.warning("the converted GGUF model is not kept (the next start converts it again): %s", exc)
        shutil.rmtree(partial, ignore_errors=True)
        return
    stem = folder.name.rsplit("-", 1)[0]
    for other in folder.parent.glob(f"{stem}-*"):
        if other != folder and _PARTIAL not in other.name:
            shutil.rmtree(other, ignore_errors=True)
    log.info("kept the converted GGUF model in %s: the next start reads it", folder)
