"""A tiny DFlash2 drafter for the tiny GLM-5.3-Flash: the files exllamav3's ``DFlash2DraftModel`` loads.

Written by ``python -m sparkfold.testing.tiny_glm DIR --decisive --drafter DIR2`` and served as
``[engine.exllamav3] drafter = "DIR2"`` unconverted (bf16: exllamav3 loads unquantized
``Linear`` weights as they are, and the DFlash2 caps mark it ``uncalibrated_quantize`` only for
a conversion nobody needs here). The layout is exllamav3 1.6.5's (``architecture/dflash2.py``:
``DFlash2Config`` reads ``dflash_config``'s ``target_layer_ids``, ``mask_token_id``,
``block_size``, ``conv_*``, ``selector_*``; ``DFlash2Model`` loads ``fc`` / ``hidden_norm`` (the
encoder over the concatenated target taps), per layer ``self_attn.{q,k,v,o}_proj`` with
``q_norm`` / ``k_norm``, ``mlp.{gate,up,down}_proj``, ``input_layernorm``,
``post_attention_layernorm``, ``attention_conv`` / ``mlp_conv`` (``base_kernel``
``[2, kernel, hidden]`` and ``kernel_projection``), then ``norm`` and ``candidate_selector``
(bare ``predecessor_codebook`` / ``successor_codebook`` ``[vocab, rank]`` and
``hidden_projection``). Its hidden size is the target's (``attach_to`` checks it), its taps two
of the target's layers (``tap_shift`` 0: the outputs of layers 1 and 3), and the block input is
the anchor (the last verified token, embedded by the target) followed by ``mask_token_id`` rows;
the target's head turns each row into logits.

Against the decisive target (``tiny_glm --decisive``, whose head maps a token's embedding to its
successor) the drafter is built to propose the right first token of every block: attention
writes nothing (``o_proj`` = 0), the MLP's conv shifts each row's input to the next row
(``base_kernel`` tap 1), and the MLP passes it on through an odd monotone map (``gate`` = ±s·I,
``up`` = I, ``down`` = [I I]: ``y ↦ s·y²·tanh(s·y/2)`` per channel), so row 1 carries the anchor's
embedding and the target's head proposes its successor; the later rows carry the mask token's and
are rejected. The selector's codebooks are 0, so its walk takes each row's best candidate.
Acceptance is about one token per block of ``BLOCK_SIZE - 1`` drafts; the replies stay the
target's (verification accepts only what the target itself picks).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["BLOCK_SIZE", "drafter_config", "drafter_tensors", "write_dflash2_drafter"]

BLOCK_SIZE = 4
HEAD_DIM = 128
CONV_KERNEL = 2
CONV_GROUP = 16
SELECTOR_RANK = 16
SELECTOR_TOP_K = 8  # exllamav3's CUDA top-k takes 8, 16 or 32
PASS_SCALE = 4.0


def drafter_config(target: dict[str, Any], mask_token_id: int) -> dict[str, Any]:
    """``config.json`` of the drafter for a target ``config.json`` (its ``text_config``)."""
    text = target.get("text_config", target)
    layers = int(text["num_hidden_layers"])
    hidden = int(text["hidden_size"])
    return {
        "architectures": ["DFlash2DraftModel"],
        "model_type": "dflash2",
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "vocab_size": int(text["vocab_size"]),
        "layer_types": ["full_attention"],
        "max_position_embeddings": 1_048_576,
        "rope_theta": 10_000.0,
        "block_size": BLOCK_SIZE,
        "dflash_config": {
            "target_layer_ids": [1, layers - 1],
            "tap_shift": 0,
            "mask_token_id": mask_token_id,
            "conv_kernel_size": CONV_KERNEL,
            "conv_group_size": CONV_GROUP,
            "selector_rank": SELECTOR_RANK,
            "selector_top_k": SELECTOR_TOP_K,
        },
        "dtype": "bfloat16",
    }


def _conv(hidden: int, prepare_tap: int) -> dict[str, Any]:
    """A dynamic conv whose prepare step reads tap ``prepare_tap`` (0: the row itself, 1: the row
    before) and whose finish step passes its row; no dynamic part."""
    import torch

    base = torch.zeros(2, CONV_KERNEL, hidden)
    base[0, prepare_tap] = 1.0
    base[1, 0] = 1.0
    groups = hidden // CONV_GROUP
    return {"base_kernel": base, "kernel_projection.weight": torch.zeros(2 * CONV_KERNEL * groups, hidden)}


def drafter_tensors(config: dict[str, Any], seed: int = 0) -> dict[str, Any]:
    """The drafter's tensors (float32), named as ``DFlash2Model`` loads them."""
    import torch

    rng = torch.Generator().manual_seed(seed)
    hidden, vocab = config["hidden_size"], config["vocab_size"]
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    taps = len(config["dflash_config"]["target_layer_ids"])
    eye = torch.eye(hidden)

    def rand(*shape: int) -> Any:
        return torch.randn(shape, generator=rng) * 0.02

    out: dict[str, Any] = {"fc.weight": rand(hidden, taps * hidden), "hidden_norm.weight": torch.ones(hidden)}
    layer = "layers.0."
    out |= {
        layer + "input_layernorm.weight": torch.ones(hidden),
        layer + "post_attention_layernorm.weight": torch.ones(hidden),
        layer + "self_attn.q_proj.weight": rand(heads * HEAD_DIM, hidden),
        layer + "self_attn.k_proj.weight": rand(kv * HEAD_DIM, hidden),
        layer + "self_attn.v_proj.weight": rand(kv * HEAD_DIM, hidden),
        layer + "self_attn.o_proj.weight": torch.zeros(hidden, heads * HEAD_DIM),
        layer + "self_attn.q_norm.weight": torch.ones(HEAD_DIM),
        layer + "self_attn.k_norm.weight": torch.ones(HEAD_DIM),
        layer + "mlp.gate_proj.weight": torch.cat([eye, -eye]) * PASS_SCALE,
        layer + "mlp.up_proj.weight": torch.cat([eye, eye]),
        layer + "mlp.down_proj.weight": torch.cat([eye, eye], dim=1),
    }
    for name, tap in (("attention_conv", 0), ("mlp_conv", 1)):
        out |= {f"{layer}{name}.{key}": value for key, value in _conv(hidden, tap).items()}
    rank = config["dflash_config"]["selector_rank"]
    out |= {
        "norm.weight": torch.ones(hidden),
        "candidate_selector.predecessor_codebook": torch.zeros(vocab, rank),
        "candidate_selector.successor_codebook": torch.zeros(vocab, rank),
        "candidate_selector.hidden_projection.weight": torch.zeros(rank, hidden),
    }
    return out


def write_dflash2_drafter(
    directory: str | Path, target: dict[str, Any], mask_token_id: int, *, seed: int = 0
) -> Path:
    """Write the drafter of the target whose ``config.json`` is ``target`` to ``directory``."""
    import torch
    from safetensors.torch import save_file

    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    config = drafter_config(target, mask_token_id)
    tensors = {k: v.to(torch.bfloat16).contiguous() for k, v in drafter_tensors(config, seed).items()}
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return path
