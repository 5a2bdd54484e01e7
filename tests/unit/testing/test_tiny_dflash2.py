"""The tiny DFlash2 drafter: the files exllamav3 1.6.5's ``architecture/dflash2.py`` loads, and
a block that proposes the decisive target's next token (its math run here as exllamav3's torch
fallbacks compute it: ``_grouped_dynamic_convolve_torch``, ``GatedMLP``, ``RMSNorm``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from click.testing import CliRunner
from safetensors.torch import load_file

from sparkfold.glm.tokens import special_token_ids
from sparkfold.testing import tiny_dflash2
from sparkfold.testing.tiny_glm import SPECIAL_BASE, VOCAB_SIZE, successors, tiny_config, write_drafter


def expected_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Name → shape as ``DFlash2Model`` (``DFlashInputLayer``, ``DFlash2Block``, ``DFlash2DynConv``,
    ``DFlash2Selector``) loads them for one layer."""
    h, v, d = config["hidden_size"], config["vocab_size"], config["head_dim"]
    q, kv, inter = (
        config["num_attention_heads"] * d,
        config["num_key_value_heads"] * d,
        config["intermediate_size"],
    )
    dflash = config["dflash_config"]
    k, rank = dflash["conv_kernel_size"], dflash["selector_rank"]
    groups = h // dflash["conv_group_size"]
    shapes = {
        "fc.weight": (h, h * len(dflash["target_layer_ids"])),
        "hidden_norm.weight": (h,),
        "norm.weight": (h,),
        "candidate_selector.predecessor_codebook": (v, rank),
        "candidate_selector.successor_codebook": (v, rank),
        "candidate_selector.hidden_projection.weight": (rank, h),
    }
    layer = "layers.0."
    shapes |= {
        layer + "input_layernorm.weight": (h,),
        layer + "post_attention_layernorm.weight": (h,),
        layer + "self_attn.q_proj.weight": (q, h),
        layer + "self_attn.k_proj.weight": (kv, h),
        layer + "self_attn.v_proj.weight": (kv, h),
        layer + "self_attn.o_proj.weight": (h, q),
        layer + "self_attn.q_norm.weight": (d,),
        layer + "self_attn.k_norm.weight": (d,),
        layer + "mlp.gate_proj.weight": (inter, h),
        layer + "mlp.up_proj.weight": (inter, h),
        layer + "mlp.down_proj.weight": (h, inter),
    }
    for conv in ("attention_conv", "mlp_conv"):
        shapes[f"{layer}{conv}.base_kernel"] = (2, k, h)
        shapes[f"{layer}{conv}.kernel_projection.weight"] = (2 * k * groups, h)
    return shapes


def written(tmp_path: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    path = write_drafter(tmp_path / "drafter")
    config = json.loads((path / "config.json").read_text())
    return config, load_file(str(path / "model.safetensors"))


def test_the_drafter_has_the_config_and_tensors_dflash2_loads(tmp_path: Path) -> None:
    config, tensors = written(tmp_path)
    target = tiny_config()["text_config"]
    dflash = config["dflash_config"]
    assert config["architectures"] == ["DFlash2DraftModel"] and config["hidden_act"] == "silu"
    assert config["hidden_size"] == target["hidden_size"] and config["vocab_size"] == target["vocab_size"]
    assert (
        all(0 <= i < target["num_hidden_layers"] for i in dflash["target_layer_ids"])
        and dflash["tap_shift"] == 0
    )
    assert dflash["mask_token_id"] == special_token_ids(SPECIAL_BASE)["[MASK]"] < VOCAB_SIZE
    assert 0 < dflash["conv_kernel_size"] <= config["block_size"]
    assert config["hidden_size"] % dflash["conv_group_size"] == 0 and dflash["selector_top_k"] in (8, 16, 32)
    assert {k: tuple(t.shape) for k, t in tensors.items()} == expected_shapes(config)
    assert all(t.dtype == torch.bfloat16 for t in tensors.values())


def rms(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x / (x.pow(2).mean(-1, keepdim=True) + 1e-5).sqrt() * weight


def conv(x: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    """exllamav3's grouped dynamic conv with no dynamic part: out[t] = sum_tap base[tap] * x[t - tap]."""
    out = torch.zeros_like(x)
    for tap in range(base.shape[0]):
        out[tap:] += base[tap] * x[: x.shape[0] - tap]
    return out


def test_the_first_row_of_a_block_proposes_the_decisive_targets_next_token(tmp_path: Path) -> None:
    config, raw = written(tmp_path)
    t = {k: v.float() for k, v in raw.items()}
    hidden = config["hidden_size"]
    # the decisive target (tiny_glm --decisive): embeddings of RMS 1 (control tokens 1e-3),
    # the head maps each embedding to its successor
    embed = torch.randn(VOCAB_SIZE, hidden, generator=torch.Generator().manual_seed(5))
    embed /= embed.pow(2).mean(-1, keepdim=True).sqrt()
    embed[SPECIAL_BASE:] *= 1e-3
    embed = embed.to(torch.bfloat16).float()
    unit = embed[:SPECIAL_BASE] / embed[:SPECIAL_BASE].norm(dim=-1, keepdim=True)
    head = torch.zeros(VOCAB_SIZE, hidden)
    head[torch.tensor(successors(0))] = unit * 2.0
    layer = "layers.0."
    mask = config["dflash_config"]["mask_token_id"]
    following = successors(0)
    anchors = range(0, SPECIAL_BASE, 31)
    hits = 0
    for anchor in anchors:
        x = embed[[anchor] + [mask] * (config["block_size"] - 1)]
        y = conv(rms(x, t[layer + "input_layernorm.weight"]), t[layer + "attention_conv.base_kernel"][0])
        attention = torch.randn(
            y.shape[0], t[layer + "self_attn.o_proj.weight"].shape[1]
        )  # whatever it attends to
        x = x + conv(
            attention @ t[layer + "self_attn.o_proj.weight"].T, t[layer + "attention_conv.base_kernel"][1]
        )
        y = conv(rms(x, t[layer + "post_attention_layernorm.weight"]), t[layer + "mlp_conv.base_kernel"][0])
        gate, up = y @ t[layer + "mlp.gate_proj.weight"].T, y @ t[layer + "mlp.up_proj.weight"].T
        y = (torch.nn.functional.silu(gate) * up) @ t[layer + "mlp.down_proj.weight"].T
        x = x + conv(y, t[layer + "mlp_conv.base_kernel"][1])
        logits = rms(x, t["norm.weight"]) @ head.T
        hits += int(torch.argmax(logits[1])) == following[anchor]
    assert hits == len(anchors)


def test_the_command_writes_the_drafter_beside_the_model(tmp_path: Path, monkeypatch: Any) -> None:
    import sparkfold.testing.tiny_glm as tiny_glm

    monkeypatch.setattr(tiny_glm, "write_tiny_glm", lambda directory, **_: Path(directory))
    result = CliRunner().invoke(tiny_glm.command, [str(tmp_path / "m"), "--drafter", str(tmp_path / "d")])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "d" / "config.json").read_text())["block_size"] == tiny_dflash2.BLOCK_SIZE
