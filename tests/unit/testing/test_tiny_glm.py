"""The tiny GLM-5.3-Flash fixture: published layout, loadable by transformers, generates."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner
from safetensors import safe_open

from sparkfold.glm.tokens import SPECIAL_TOKENS
from sparkfold.testing.tiny_glm import SIZES, SPECIAL_BASE, VOCAB_SIZE, command, write_tiny_glm

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny") / "model"
    result = CliRunner().invoke(command, [str(path), "--seed", "1"])
    assert result.exit_code == 0, result.output
    return path


@pytest.fixture(scope="module")
def tensors(written: Path) -> dict[str, tuple[int, ...]]:
    with safe_open(str(written / "model.safetensors"), "pt") as f:
        return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118


def test_config_is_in_the_published_spelling(written: Path) -> None:
    config = json.loads((written / "config.json").read_text())
    text = config["text_config"]
    assert config["architectures"] == ["Glm5NextForConditionalGeneration"]
    assert text["layer_types"] == ["linear_attention"] * 3 + ["deepseek_sparse_attention"]
    assert set(text["linear_attn_config"]) == {
        "num_heads",
        "head_dim",
        "short_conv_kernel_size",
        "gate_lower_bound",
    }
    assert text["linear_attn_config"]["head_dim"] == 128
    for key, value in {
        "index_kpool_compress": True,
        "mhc": True,
        "scoring_func": "sigmoid",
        "topk_method": "noaux_tc",
        "num_nextn_predict_layers": 1,
        "hidden_size": 256,
        "moe_intermediate_size": 128,
        "q_lora_rank": 128,
        "kv_lora_rank": 128,
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "n_shared_experts": 1,
    }.items():
        assert text[key] == value, key
    assert "first_k_dense_replace" in text
    assert config["vision_config"]["depth"] == 2
    processor = json.loads((written / "processor_config.json").read_text())["image_processor"]
    for key in (
        "patch_size",
        "temporal_patch_size",
        "merge_size",
        "image_mean",
        "image_std",
        "min_image_tokens",
        "max_image_tokens",
    ):
        assert key in processor


def test_tensors_are_in_the_published_layout(tensors: dict[str, tuple[int, ...]]) -> None:
    layer0 = "model.language_model.layers.0."
    layer1 = "model.language_model.layers.1."
    for name in (
        "self_attn.q_conv1d.weight",
        "self_attn.k_conv1d.weight",
        "self_attn.v_conv1d.weight",
        "self_attn.f_a_proj.weight",
        "self_attn.A_log",
        "hc_attn_fn",
        "hc_ffn_scale",
    ):
        assert layer0 + name in tensors, name
    assert layer1 + "mlp.experts.7.gate_proj.weight" in tensors
    assert tensors[layer1 + "mlp.experts.0.down_proj.weight"] == (256, 128)
    assert not [
        k
        for k in tensors
        if "gate_up_proj" in k
        or "forget_gate" in k
        or "attn_hc." in k
        or k.endswith("self_attn.conv1d.weight")
    ]
    mtp = "model.language_model.layers.4."
    assert tensors[mtp + "eh_proj.weight"] == (256, 512)
    for name in (
        "enorm.weight",
        "hnorm.weight",
        "shared_head.norm.weight",
        "self_attn.kv_b_proj.weight",
        "self_attn.indexer.wq_b.weight",
        "mlp.experts.0.up_proj.weight",
    ):
        assert mtp + name in tensors, name
    assert not [k for k in tensors if k.startswith(mtp) and ".hc_" in k]
    assert any(k.startswith("model.visual.blocks.1.") for k in tensors)
    projections = [
        s for k, s in tensors.items() if k.startswith("model.language_model.") and k.endswith("proj.weight")
    ]
    assert all(d % 128 == 0 for shape in projections for d in shape if d > 8)  # head counts aside
    assert tensors["lm_head.weight"] == (VOCAB_SIZE, 256)


def test_a_dense_trunk_still_gets_the_routed_mtp_block_exllamav3_converts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bench sizes are dense throughout; exllamav3's converter builds the MTP head whenever the
    architecture has one (convert_model.get_base_model) and its block is routed (glm5_next_mtp)."""
    monkeypatch.setitem(SIZES, "dense", SIZES["tiny"] | {"dense_layers": 4})
    path = write_tiny_glm(tmp_path / "dense", size="dense")
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert "model.language_model.layers.3.mlp.gate_proj.weight" in names  # the trunk: dense
    mtp = "model.language_model.layers.4."
    routed = {
        "hnorm.weight",
        "mlp.gate.weight",
        "mlp.gate.e_score_correction_bias",
        "mlp.experts.7.down_proj.weight",
        "mlp.shared_experts.up_proj.weight",
    }
    assert {mtp + name for name in routed} <= names
    assert not [
        k
        for k in names
        if k.startswith(mtp + "mlp.") and k.endswith(("mlp.gate_proj.weight", "mlp.up_proj.weight"))
    ]


def test_tokenizer_holds_the_glm_tokens_in_published_order(written: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(written))
    assert [tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == [
        SPECIAL_BASE + i for i in range(len(SPECIAL_TOKENS))
    ]
    assert "Reasoning Effort" in (tokenizer.chat_template or "")
    generation = json.loads((written / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [SPECIAL_BASE + 0, SPECIAL_BASE + 7, SPECIAL_BASE + 9]


def _load(path: Path) -> tuple[Any, dict[str, Any]]:
    from transformers import AutoModelForImageTextToText

    model, info = AutoModelForImageTextToText.from_pretrained(
        str(path), dtype=torch.float32, output_loading_info=True
    )
    return model.eval(), info


def test_transformers_loads_every_weight_and_generates(written: Path, one_thread: None) -> None:
    model, info = _load(written)
    assert info["missing_keys"] == set() or not info["missing_keys"]
    assert all(".layers.4." in k for k in info["unexpected_keys"])  # the MTP block only
    prompt = torch.tensor(
        [[SPECIAL_BASE + 2, SPECIAL_BASE + 4, SPECIAL_BASE + 7, 300, 301, SPECIAL_BASE + 8]]
    )
    first = model.generate(prompt, max_new_tokens=8, do_sample=False)
    again = model.generate(prompt, max_new_tokens=8, do_sample=False)
    assert first.shape[1] > prompt.shape[1] and torch.equal(first, again)


def test_decisive_widens_the_greedy_margin(written: Path, tmp_path: Path, one_thread: None) -> None:
    result = CliRunner().invoke(command, [str(tmp_path / "d"), "--seed", "1", "--decisive"])
    assert result.exit_code == 0, result.output
    prompt = torch.tensor([[SPECIAL_BASE + 2, SPECIAL_BASE + 4, 100, 200, 300]])

    def margin(path: Path) -> float:
        model, _ = _load(path)
        with torch.no_grad():
            top = model(prompt).logits[0, -1].topk(2).values
        return float(top[0] - top[1])

    plain, decisive = margin(written), margin(tmp_path / "d")
    assert decisive > 10 * plain and decisive > 1.0
