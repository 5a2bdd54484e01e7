"""The reference recipe's engine settings: typed in [engine.tensorfold], rendered into the flags and
environment its ranks read, and refused (naming the image) where the image's profile cannot honour
them. examples/spark-pair/recipe-{head,worker}.toml are the recipe's own settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from sparkfold.cli import main
from sparkfold.config import ConfigError, Settings, engine_fingerprint, load, parse
from sparkfold.engines.tensorfold.launch import FabricFacts, launch_plan
from sparkfold.engines.tensorfold.process import RankStartError
from sparkfold.engines.tensorfold.profile import STOCK, ProfileError, load_profile, refusals
from sparkfold.node.tensorfold_rank import check_image

DRAFTER = "/var/lib/sparkfold/models/incoai/GLM-5.3-Flash-DFlash2/bf582e4eacc1810f76656d1811693ff6c6737d2a"
FACTS = FabricFacts("enp1s0f1np1", ("rocep1s0f1",), 3)


def recipe(repo: Path, name: str) -> Path:
    return repo / f"examples/spark-pair/recipe-{name}.toml"


def changed(repo: Path, tensorfold: dict[str, Any] | None = None, **engine: Any) -> Settings:
    data = load(recipe(repo, "head")).model_dump(mode="json", exclude_none=True)
    data["engine"] |= engine
    if "parallel" in engine:  # the example leaves api.parallel out: the gateway follows the engine
        data["api"].pop("parallel", None)
    data["engine"]["tensorfold"] |= tensorfold or {}
    data["engine"]["tensorfold"] = {k: v for k, v in data["engine"]["tensorfold"].items() if v is not None}
    return parse(data)


@pytest.mark.parametrize(("name", "rank"), [("head", 0), ("worker", 1)])
def test_dry_run_prints_the_rank_with_the_recipes_settings(repo: Path, name: str, rank: int) -> None:
    result = CliRunner().invoke(main, ["engine", "--config", str(recipe(repo, name)), "--dry-run"])
    assert result.exit_code == 0, result.output
    argv = next(line for line in result.output.splitlines() if line.startswith("argv"))
    for part in (
        f"--tp 2 --rank {rank} --master 203.0.113.1 --master-port 29551",
        f"--drafter {DRAFTER}",
        "--context 1048576 --parallel 4",
        "--vision",
        "-e TF_GLM_KV=fp8",
        "-e TF_GLM_DENSE=q4",
        "-e NCCL_IB_GID_INDEX=3",
        "-e NCCL_MIN_NCHANNELS=4",
        f"-v {DRAFTER}:{DRAFTER}:ro",
    ):
        assert part in argv, part
    assert "NCCL_SOCKET_IFNAME=enp1s0f" in argv and "NCCL_IB_HCA==rocep1s0f" in argv
    assert ("--name GLM-5.3-Flash-EXL3" in argv) == (rank == 0)


@pytest.mark.parametrize("name", ["head", "worker"])
def test_config_check_accepts_the_recipe_image_and_refuses_a_stock_one(repo: Path, name: str) -> None:
    runner = CliRunner()
    image = repo / "examples/spark-pair/recipe-image.toml"
    ok = runner.invoke(main, ["config", "check", str(recipe(repo, name)), "--image-profile", str(image)])
    assert ok.exit_code == 0, ok.output
    stock = repo / "patches/tensorfold/v0.6.0/profile.toml"
    refused = runner.invoke(main, ["config", "check", str(recipe(repo, name)), "--image-profile", str(stock)])
    assert refused.exit_code == 1
    words = " ".join(refused.output.split())
    assert f'image "stock TensorFold v0.6.0 (sparkfold\'s own series, empty)", profile {stock}' in words
    for setting in ("engine.parallel = 4", 'engine.tensorfold.kv = "fp8"', 'engine.tensorfold.dense = "q4"'):
        assert setting in words
    assert "cannot honour these [engine] settings" in words and "docs/patches.md" in words


def test_no_profile_is_stock_and_the_stock_example_passes(repo: Path) -> None:
    assert refusals(load(repo / "examples/spark-pair/head.toml"), STOCK) == []
    data = load(recipe(repo, "head")).model_dump(mode="json", exclude_none=True)
    del data["engine"]["tensorfold"]["image_profile"]
    with pytest.raises(RankStartError, match=r'image "stock TensorFold v0\.6\.0 \(no image_profile'):
        check_image(parse(data))


@pytest.mark.parametrize(
    ("engine", "tensorfold", "message"),
    [
        ({}, {"drafter": "none"}, "needs the DFlash2 drafter"),
        ({}, {"kv": "bf16"}, "does not fit a bf16 KV cache here (about 196608 tokens"),
        ({"parallel": 1}, {"kv": "bf16", "drafter": "none", "verify_window": None}, "about 524288 tokens"),
        ({"context": 196608}, {"kv": "bf16", "dense": "fp8"}, "about 163840 tokens"),
    ],
)
def test_engine_rules_that_depend_on_the_image(
    repo: Path, engine: dict[str, Any], tensorfold: dict[str, Any], message: str
) -> None:
    profile = load_profile(repo / "examples/spark-pair/recipe-image.toml")
    problems = refusals(changed(repo, tensorfold, **engine), profile)
    assert any(message in problem for problem in problems), problems


@pytest.mark.parametrize(
    ("engine", "tensorfold", "message"),
    [
        ({"parallel": 9}, {}, "engine.parallel is 1 to 8 for tensorfold, not 9"),
        ({"context": 2_000_000}, {}, "engine.context is at most 1048576 for tensorfold"),
        ({}, {"verify_window": 20}, "verify_window is 16 to 64 in steps of 8, not 20"),
        ({}, {"display_kv_mib": 1000}, "display_kv_mib is a multiple of 16"),
        ({}, {"spill_gib": 64}, "spill_gib > 0 needs spill_dir: an absolute folder"),
        ({}, {"spill_gib": 64, "spill_dir": "/s", "kv_tier_gib": 8, "kv_tier_dir": "/k"}, "two disk tiers"),
        ({"parallel": 1}, {"kv_tier_gib": 8, "kv_tier_dir": "/k"}, "kv_tier_gib needs engine.parallel > 1"),
        ({}, {"kept_share_pct": 80}, "kept_share_pct"),
    ],
)
def test_the_recipes_ranges_and_dependencies(
    repo: Path, engine: dict[str, Any], tensorfold: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match="engine") as caught:
        changed(repo, tensorfold, **engine)
    assert message in str(caught.value)


def test_disk_tiers_and_display_memory_are_rendered_and_mounted(repo: Path) -> None:
    settings = changed(
        repo,
        {"spill_gib": 64, "spill_dir": "/srv/spill", "display_kv_mib": 1792, "loop_guard": True},
    )
    plan = launch_plan(settings, FACTS)
    command = " ".join(plan.command)
    assert "--spill-gib 64 --snapshot-dir /spill --spill-highwater 0.7 --spill-min-tokens 8192" in command
    argv = " ".join(plan.argv)
    assert "-v /srv/spill:/spill" in argv and "--device /dev/dri/card0" in argv
    assert plan.rank_env["TF_GLM_DISPLAY_KV_MIB"] == "1792" and plan.rank_env["TF_GLM_LOOP_GUARD"] == "1"
    tier = launch_plan(changed(repo, {"kv_tier_gib": 32, "kv_tier_dir": "/srv/kv"}), FACTS)
    assert "-v /srv/kv:/srv/kv" in " ".join(tier.argv)
    # the recipe's own names (its start.sh at 05f75fd): the folder is TF_GLM_KV_TIER, the floor _MIN
    assert {k: v for k, v in tier.rank_env.items() if k.startswith("TF_GLM_KV_TIER")} == {
        "TF_GLM_KV_TIER": "/srv/kv",
        "TF_GLM_KV_TIER_GIB": "32",
        "TF_GLM_KV_TIER_MIN": "8192",
        "TF_GLM_KV_TIER_MIN_FREE_GIB": "50",
        "TF_GLM_KV_TIER_BACKLOG_GIB": "16",
    }
    dispram = launch_plan(changed(repo, {"display_kv_mib": 1792, "display_kv_backend": "dispram"}), FACTS)
    argv = " ".join(dispram.argv)
    assert "-v /run/dispram:/run/dispram " in argv
    assert "-v /opt/kindling/dispram/python:/opt/dispram:ro" in argv
    assert dispram.rank_env["PYTHONPATH"] == "/opt/dispram" and "/dev/dri/card0" not in argv
    host = launch_plan(changed(repo, {"launcher": "host", "spill_gib": 8, "spill_dir": "/srv/spill"}), FACTS)
    assert "--snapshot-dir /srv/spill" in " ".join(host.command)


def test_a_bad_profile_is_named(tmp_path: Path) -> None:
    profile = tmp_path / "profile.toml"
    profile.write_text('image = "x"\nsupports = ["parallel", "teleport"]\n')
    with pytest.raises(ProfileError, match=r"unknown features \['teleport'\]"):
        load_profile(profile)
    with pytest.raises(ProfileError, match="cannot read the image profile"):
        load_profile(tmp_path / "missing.toml")


def test_the_recipe_pair_shares_one_engine_section(repo: Path) -> None:
    head, worker = load(recipe(repo, "head")), load(recipe(repo, "worker"))
    assert engine_fingerprint(head) == engine_fingerprint(worker)
    assert (head.api.parallel, head.api.max_queued) == (4, 16), "the gateway's lanes follow the engine"
