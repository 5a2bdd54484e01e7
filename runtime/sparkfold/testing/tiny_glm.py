"""A tiny random GLM-5.3-Flash: the real architecture at toy size, in the published layout.

``python -m sparkfold.testing.tiny_glm DIR [--seed N] [--decisive] [--drafter DIR2]`` writes
(``--drafter``: also a tiny DFlash2 drafter for it in DIR2, :mod:`sparkfold.testing.tiny_dflash2`):

* ``config.json``: ``Glm5NextForConditionalGeneration`` with a ``text_config`` as published
  checkpoints write it (``layer_types`` with ``deepseek_sparse_attention``, a
  ``linear_attn_config`` dict, ``index_kpool_compress``, ``mhc``, ``scoring_func``,
  ``topk_method``, ``first_k_dense_replace``, ``num_nextn_predict_layers: 1``) and a 2-block
  vision tower; 4 text layers (3 KDA + 1 DSA), 8 routed experts (top-2) + 1 shared, hidden 256,
  KDA head dim 128, every other width a multiple of 128;
* ``model.safetensors`` in the published tensor layout (per-expert weights, separate
  ``q/k/v_conv1d``, ``self_attn.f_a_proj`` …, ``hc_attn_fn`` …) plus one MTP block at layer
  index ``num_hidden_layers`` (``enorm``, ``hnorm``, ``eh_proj``, ``shared_head.norm`` and a
  sparse-attention layer's tensors, no mHC tensors);
* a byte-level BPE tokenizer trained here with the GLM control tokens in their published order
  (``id - base`` as in the real vocabulary, base = vocab − 60), sparkfold's chat template,
  ``generation_config.json`` with the GLM stop ids and ``processor_config.json``.

``decisive`` (exactness tests that must not flip on rounding) makes the next token a fixed
function of the current one, with a margin far above bf16 and 4-bit noise: embedding rows are
scaled to RMS 1, so the residual stream stays the token's own embedding while every layer (and
its KV cache / recurrent state) still runs; the output head is the unit embedding rows, permuted
(:func:`successors`: cycles of ``DECISIVE_CYCLE`` ordinary tokens) and times
``DECISIVE_HEAD_SCALE``. Control tokens get embeddings of RMS ``DECISIVE_CONTROL_RMS`` and zero
head rows: they are never chosen, and the token after one (the first of a chat reply) is decided
by the context, so a picture still changes a chat reply; block outputs (``o_proj``,
``down_proj``) are scaled by ``DECISIVE_BLOCK_SCALE`` so that context clears the final norm's
epsilon there. On CPU (transformers, float32) every ordinary position of 12 random contexts chose
its successor by at least 19 logits (of ~30); after a control token the margin is ~0.6. The MTP
block's ``eh_proj`` passes the next token's embedding through, so MTP drafts are right whenever
the next token is ordinary. Without ``decisive`` (random weights) logits are near-flat: batch
shape, drafts and tp change rounding and may flip greedy choices. Nothing is downloaded.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

import click

from sparkfold.glm.render import default_template
from sparkfold.glm.tokens import ENDOFTEXT, SPECIAL_TOKENS, special_token_ids

__all__ = [
    "SIZES",
    "SPECIAL_BASE",
    "VOCAB_SIZE",
    "command",
    "successors",
    "tiny_config",
    "write_drafter",
    "write_tiny_glm",
]

VOCAB_SIZE = 1024
SPECIAL_BASE = VOCAB_SIZE - 60  # the published vocabulary also ends 60 ids after <|endoftext|>
HIDDEN = 256
DECISIVE_BLOCK_SCALE = 10.0  # random blocks add ~1e-3 RMS; x10 still leaves >= 19 logits
DECISIVE_HEAD_SCALE = 2.0
DECISIVE_CONTROL_RMS = 1e-3
DECISIVE_CYCLE = 16
_OUTPUT_PROJECTIONS = ("o_proj.weight", "down_proj.weight", "experts.down_proj")

_WORD_TEXT = """
the of and to in is you that it he was for on are as with his they at be this have from or one had
by word but not what all were we when your can said there use an each which she do how their if will
up other about out many then them these so some her would make like him into time has look two more
write go see number no way could people my than first water been call who oil its now find long down
day did get come made may part over new sound take only little work know place year live me back
give most very after thing our just name good sentence man think say great where help through much
before line right too mean old any same tell boy follow came want show also around form three small
set put end does another well large must big even such because turn here why ask went men read need
land different home us move try kind hand picture again change off play spell air away animal house
point page letter mother answer found study still learn should world weather city paris rome tokyo
london sunny rain cloudy temperature json object array string number true false null yes no red
green blue image video
"""
_WORDS = tuple(_WORD_TEXT.split())


def _corpus(seed: int) -> list[str]:
    rng = random.Random(seed)
    lines = []
    for _ in range(3000):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(3, 14))]
        if rng.random() < 0.5:
            words[0] = words[0].capitalize()
        lines.append(" ".join(words) + rng.choice([".", "?", "!", ",", ":"]))
    for _ in range(800):
        obj = {rng.choice(_WORDS): rng.choice([rng.randint(-999, 9999), rng.choice(_WORDS), True, None, 1.5])}
        lines.append(json.dumps(obj))
        lines.append(f"def {rng.choice(_WORDS)}_{rng.choice(_WORDS)}(x): return x + {rng.randint(0, 99)}")
    return lines


def _tokenizer(seed: int) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=SPECIAL_BASE, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(_corpus(seed), trainer=trainer)
    size = tok.get_vocab_size()
    if size < SPECIAL_BASE:  # pad so the control tokens land on their published offsets
        tok.add_tokens([f"<|filler_{i}|>" for i in range(SPECIAL_BASE - size)])
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    wrapped = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok,
        eos_token=ENDOFTEXT,
        pad_token=ENDOFTEXT,
        clean_up_tokenization_spaces=False,
        model_max_length=1_048_576,
    )
    wrapped.chat_template = default_template()
    return wrapped


SIZES: dict[str, dict[str, int]] = {
    "tiny": {"hidden": HIDDEN, "layers": 4, "heads": 2, "intermediate": 256, "lora": 128, "dense_layers": 1},
    "bench": {
        "hidden": 4096,
        "layers": 8,
        "heads": 32,
        "intermediate": 16384,
        "lora": 1024,
        "dense_layers": 8,
    },
    "mid": {
        "hidden": 2048,
        "layers": 8,
        "heads": 16,
        "intermediate": 8192,
        "lora": 512,
        "dense_layers": 8,
    },
}
"""``bench``: ~2.1B parameters (8 layers, hidden 4096, dense MLPs; 4.3 GB in bf16), so that a
decoding step is mostly GPU work rather than Python (benchmarks, in bf16 or converted to EXL3);
``mid``: the same shape at a quarter of the parameters (~0.55B), when a conversion must be quick;
``tiny``: seconds to write and convert (tests)."""


def tiny_config(size: str = "tiny") -> dict[str, Any]:
    """``config.json`` of the tiny model, in the published checkpoints' spelling."""
    ids = special_token_ids(SPECIAL_BASE)
    dims = SIZES[size]
    layers = dims["layers"]
    text = {
        "model_type": "glm5_next_text",
        "vocab_size": VOCAB_SIZE,
        "hidden_size": dims["hidden"],
        "intermediate_size": dims["intermediate"],
        "moe_intermediate_size": 128,
        "num_hidden_layers": layers,
        "num_attention_heads": dims["heads"],
        "num_key_value_heads": dims["heads"],
        "layer_types": (["linear_attention"] * 3 + ["deepseek_sparse_attention"]) * (layers // 4),
        "mlp_layer_types": ["dense"] * dims["dense_layers"] + ["sparse"] * (layers - dims["dense_layers"]),
        "first_k_dense_replace": dims["dense_layers"],
        "indexer_types": ["full"] * layers,
        "linear_attn_config": {
            "num_heads": dims["heads"],
            "head_dim": 128,
            "short_conv_kernel_size": 4,
            "gate_lower_bound": -5.0,
        },
        "q_lora_rank": dims["lora"],
        "kv_lora_rank": dims["lora"],
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 0,
        "v_head_dim": 128,
        "index_n_heads": 2,
        "index_head_dim": 128,
        "index_topk": 64,
        "index_kpool": 4,
        "index_kpool_compress": True,
        "index_kpool_always_select_tail": True,
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "n_shared_experts": 1,
        "n_group": 1,
        "topk_group": 1,
        "norm_topk_prob": True,
        "routed_scaling_factor": 2.5,
        "scoring_func": "sigmoid",
        "topk_method": "noaux_tc",
        "swiglu_limit": 10.0,
        "hidden_act": "silu",
        "mhc": True,
        "hc_mult": 4,
        "hc_eps": 1e-6,
        "hc_sinkhorn_iters": 20,
        "num_nextn_predict_layers": 1,
        "max_position_embeddings": 1_048_576,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "pad_token_id": ids[ENDOFTEXT],
        "eos_token_id": [ids["<|endoftext|>"], ids["<|user|>"], ids["<|observation|>"]],
        "bos_token_id": ids["[gMASK]"],
    }
    vision = {
        "model_type": "glm5_next_vision",
        "depth": 2,
        "hidden_size": 128,
        "num_heads": 2,
        "intermediate_size": 256,
        "out_hidden_size": dims["hidden"],
        "projection_intermediate_size": 256,
        "hidden_act": "silu",
        "attention_bias": True,
        "image_size": 336,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "in_channels": 3,
        "rms_norm_eps": 1e-5,
        "swiglu_limit": 10.0,
    }
    return {
        "architectures": ["Glm5NextForConditionalGeneration"],
        "model_type": "glm5_next",
        "text_config": text,
        "vision_config": vision,
        "image_token_id": ids["<|image|>"],
        "video_token_id": ids["<|video|>"],
        "image_start_token_id": ids["<|begin_of_image|>"],
        "image_end_token_id": ids["<|end_of_image|>"],
        "video_start_token_id": ids["<|begin_of_video|>"],
        "video_end_token_id": ids["<|end_of_video|>"],
        "tie_word_embeddings": False,
        "dtype": "bfloat16",
        "transformers_version": "5.24.0",
    }


def _processor_config() -> dict[str, Any]:
    common = {
        "patch_size": 14,
        "temporal_patch_size": 2,
        "merge_size": 2,
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711],
        "do_resize": True,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "do_convert_rgb": True,
        "resample": 3,
        "min_image_tokens": 16,
        "max_image_tokens": 256,
    }
    return {
        "processor_class": "Glm5NextProcessor",
        "image_processor": {**common, "image_processor_type": "Glm5NextImageProcessor"},
        "video_processor": {
            **common,
            "max_image_tokens": 1024,
            "video_processor_type": "Glm5NextVideoProcessor",
            "fps": 2.0,
            "num_frames": 16,
        },
    }


_RENAMES = (
    (re.compile(r"\.self_attn\.forget_gate\."), ".self_attn."),
    (re.compile(r"\.attn_hc\.(fn|base|scale)$"), r".hc_attn_\1"),
    (re.compile(r"\.ffn_hc\.(fn|base|scale)$"), r".hc_ffn_\1"),
)


def _published(state: dict[str, Any], text_config: Any) -> dict[str, Any]:
    """transformers' in-memory names and fused tensors → the published checkpoint layout."""
    out: dict[str, Any] = {}
    inter = text_config.moe_intermediate_size
    for name, tensor in state.items():
        if name.endswith(".mlp.experts.gate_up_proj"):
            base = name.removesuffix("gate_up_proj")
            for e in range(tensor.shape[0]):
                out[f"{base}{e}.gate_proj.weight"] = tensor[e, :inter].contiguous()
                out[f"{base}{e}.up_proj.weight"] = tensor[e, inter:].contiguous()
            continue
        if name.endswith(".mlp.experts.down_proj"):
            base = name.removesuffix("down_proj")
            for e in range(tensor.shape[0]):
                out[f"{base}{e}.down_proj.weight"] = tensor[e].contiguous()
            continue
        if name.endswith(".self_attn.conv1d.weight"):
            base = name.removesuffix("conv1d.weight")
            for part, chunk in zip("qkv", tensor.chunk(3, dim=0), strict=True):
                out[f"{base}{part}_conv1d.weight"] = chunk.contiguous()
            continue
        for pattern, replacement in _RENAMES:
            name = pattern.sub(replacement, name)
        out[name] = tensor.contiguous()
    return out


def _mtp_block(published: dict[str, Any], text: dict[str, Any], generator: Any) -> dict[str, Any]:
    """One MTP block at index ``num_hidden_layers``: DS3-style inputs plus a sparse-attention layer
    with a routed MLP (exllamav3's ``Glm5NextMTPModel`` reads experts there even when every trunk
    layer is dense, as in the bench sizes), no mHC."""
    import torch

    layers = text["num_hidden_layers"]
    donor = f"model.language_model.layers.{layers - 1}."
    target = f"model.language_model.layers.{layers}."
    hidden = published["model.language_model.norm.weight"].shape[0]
    dtype = published["model.language_model.norm.weight"].dtype

    def random(*shape: int) -> Any:
        return torch.randn(shape, generator=generator, dtype=torch.float32).mul(0.02).to(dtype)

    block: dict[str, Any] = {}
    for name, tensor in published.items():
        if name.startswith(donor) and ".hc_" not in name:
            block[target + name[len(donor) :]] = (
                random(*tensor.shape) if tensor.dim() >= 2 else tensor.clone()
            )
    if target + "mlp.gate.weight" not in block:  # a dense donor: the routed MLP the head expects
        for part in ("gate_proj", "up_proj", "down_proj"):
            del block[f"{target}mlp.{part}.weight"]
        experts, width = text["n_routed_experts"], text["moe_intermediate_size"]
        block[target + "mlp.gate.weight"] = random(experts, hidden)
        block[target + "mlp.gate.e_score_correction_bias"] = torch.zeros(experts, dtype=torch.float32)
        for prefix, inner in [(f"mlp.experts.{i}.", width) for i in range(experts)] + [
            ("mlp.shared_experts.", width * text["n_shared_experts"])
        ]:
            block[f"{target}{prefix}gate_proj.weight"] = random(inner, hidden)
            block[f"{target}{prefix}up_proj.weight"] = random(inner, hidden)
            block[f"{target}{prefix}down_proj.weight"] = random(hidden, inner)
    block[target + "enorm.weight"] = torch.ones(hidden, dtype=dtype)
    block[target + "hnorm.weight"] = torch.ones(hidden, dtype=dtype)
    block[target + "shared_head.norm.weight"] = torch.ones(hidden, dtype=dtype)
    eh = torch.randn((hidden, 2 * hidden), generator=generator).mul(0.02)
    block[target + "eh_proj.weight"] = eh.to(dtype)
    return block


def successors(seed: int = 0) -> list[int]:
    """The decisive fixture's next token of each ordinary token: cycles of ``DECISIVE_CYCLE`` ids."""
    order = list(range(SPECIAL_BASE))
    random.Random(seed).shuffle(order)
    nxt = list(range(SPECIAL_BASE))
    for start in range(0, SPECIAL_BASE, DECISIVE_CYCLE):
        cycle = order[start : start + DECISIVE_CYCLE]
        if len(cycle) < DECISIVE_CYCLE // 2 and start:  # a short tail joins the cycle before it
            cycle = order[start - DECISIVE_CYCLE : start + DECISIVE_CYCLE]
        for a, b in zip(cycle, cycle[1:] + cycle[:1], strict=True):
            nxt[a] = b
    return nxt


def _make_decisive(model: Any, seed: int) -> None:
    """Embedding-dominated residual stream and a permutation head (see the module docstring)."""
    import torch

    text = model.model.language_model
    with torch.no_grad():
        embed = text.embed_tokens.weight
        embed.div_(embed.pow(2).mean(-1, keepdim=True).sqrt())
        embed[SPECIAL_BASE:] *= DECISIVE_CONTROL_RMS
        unit = embed[:SPECIAL_BASE] / embed[:SPECIAL_BASE].norm(dim=-1, keepdim=True)
        head = torch.zeros_like(model.lm_head.weight)
        head[torch.tensor(successors(seed))] = unit * DECISIVE_HEAD_SCALE
        model.lm_head.weight.copy_(head)
        for name, tensor in text.named_parameters():
            if name.endswith(_OUTPUT_PROJECTIONS):
                tensor.mul_(DECISIVE_BLOCK_SCALE)


def _decisive_mtp(block: dict[str, Any], layers: int) -> None:
    """The MTP block passes the next token's embedding through (``eh_proj`` = [I | 0])."""
    import torch

    target = f"model.language_model.layers.{layers}."
    eh = block[target + "eh_proj.weight"]
    hidden = eh.shape[0]
    block[target + "eh_proj.weight"] = torch.cat([torch.eye(hidden), torch.zeros(hidden, hidden)], dim=1).to(
        eh.dtype
    )
    for name, tensor in block.items():
        if name.endswith(_OUTPUT_PROJECTIONS):
            block[name] = (tensor.float() * DECISIVE_BLOCK_SCALE).to(tensor.dtype)


def write_tiny_glm(
    directory: str | Path, *, seed: int = 0, decisive: bool = False, size: str = "tiny"
) -> Path:
    """Write the tiny model to ``directory`` (created) and return its path."""
    import torch
    from safetensors.torch import save_file
    from transformers import Glm5NextConfig, Glm5NextForConditionalGeneration

    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    config = tiny_config(size)
    torch.manual_seed(seed)
    device = "cuda" if size != "tiny" and torch.cuda.is_available() else "cpu"  # bench: fast init
    with torch.device(device):
        model = Glm5NextForConditionalGeneration(Glm5NextConfig(**config))
    model.train(False)
    if decisive:
        _make_decisive(model, seed)
    state = {k: v.detach().to(torch.bfloat16).cpu() for k, v in model.state_dict().items()}
    published = _published(state, model.config.text_config)
    layers = config["text_config"]["num_hidden_layers"]
    if config["text_config"]["num_nextn_predict_layers"]:
        mtp = _mtp_block(published, config["text_config"], torch.Generator().manual_seed(seed))
        if decisive:
            _decisive_mtp(mtp, layers)
        published |= mtp
    save_file(published, str(path / "model.safetensors"), metadata={"format": "pt"})

    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    ids = special_token_ids(SPECIAL_BASE)
    generation = {
        "eos_token_id": config["text_config"]["eos_token_id"],
        "pad_token_id": ids[ENDOFTEXT],
        "do_sample": False,
        "transformers_version": "5.24.0",
    }
    (path / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n", encoding="utf-8")
    (path / "processor_config.json").write_text(
        json.dumps(_processor_config(), indent=2) + "\n", encoding="utf-8"
    )
    _tokenizer(seed).save_pretrained(str(path))
    return path


@click.command()
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path), metavar="DIR")
@click.option("--seed", type=int, default=0, show_default=True, help="seed of the random weights")
@click.option("--decisive", is_flag=True, help="each greedy choice a fixed function of the last token")
@click.option(
    "--size",
    type=click.Choice(sorted(SIZES)),
    default="tiny",
    show_default=True,
    help="tiny (tests), bench (~2.1B parameters, dense MLPs: the GPU is the bottleneck) or mid (~0.55B)",
)
@click.option(
    "--drafter",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    metavar="DIR2",
    help="also write a tiny DFlash2 drafter of this model to DIR2",
)
def command(directory: Path, seed: int, decisive: bool, size: str, drafter: Path | None) -> None:
    """Write the tiny random GLM-5.3-Flash test model to DIR."""
    click.echo(write_tiny_glm(directory, seed=seed, decisive=decisive, size=size))
    if drafter is not None:
        click.echo(write_drafter(drafter, size=size, seed=seed))


def write_drafter(directory: str | Path, *, size: str = "tiny", seed: int = 0) -> Path:
    """The tiny DFlash2 drafter of the ``size`` model (:mod:`sparkfold.testing.tiny_dflash2`)."""
    from sparkfold.testing.tiny_dflash2 import write_dflash2_drafter

    mask = special_token_ids(SPECIAL_BASE)["[MASK]"]
    return write_dflash2_drafter(directory, tiny_config(size), mask, seed=seed)


if __name__ == "__main__":
    command()
