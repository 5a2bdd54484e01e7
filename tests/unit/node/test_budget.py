"""``sparkfold.node.budget``: the engine's footprint against a node, for the recipe and past it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from sparkfold.config import Settings, load
from sparkfold.node.budget import budget, usable_memory
from sparkfold.node.checks import Runner
from sparkfold.node.preflight import preflight
from sparkfold.weights.manifest import Manifest, ManifestFile, default_manifest_path

EXAMPLES = Path(__file__).resolve().parents[3] / "examples/spark-pair"
SPARK_TOTAL_KIB = int(121.69 * 1024 * 1024)  # a GB10's MemTotal (128 GB of unified memory)
CHECKPOINT = 176_000_000_000  # the recipe's checkpoint: ~176 GB, split over the two ranks
DRAFTER = 2 * 1024**3  # the DFlash2 drafter, whole on every rank


def write_manifest(root: Path, directory: str, total: int) -> None:
    """The weights stage's manifest of ``total`` bytes beside ``directory`` under ``root``."""
    files = [ManifestFile(path="model.safetensors", sha256="0" * 64, size=total)]
    path = default_manifest_path(root / directory.lstrip("/"))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(Manifest.of(files).to_json())


def spark(root: Path, total_kib: int = SPARK_TOTAL_KIB) -> Path:
    (root / "proc").mkdir(parents=True, exist_ok=True)
    (root / "proc/meminfo").write_text(f"MemTotal: {total_kib} kB\nMemAvailable: {total_kib // 2} kB\n")
    return root


def recipe(tmp_path: Path, name: str = "recipe-head.toml", **tensorfold: object) -> Settings:
    """The recipe's settings as the example inventory renders them, their weights under tmp_path."""
    settings = load(EXAMPLES / name)
    write_manifest(tmp_path, settings.engine.model, CHECKPOINT)
    write_manifest(tmp_path, settings.engine.tensorfold.drafter, DRAFTER)
    tf = settings.engine.tensorfold.model_copy(update=tensorfold)
    return settings.model_copy(update={"engine": settings.engine.model_copy(update={"tensorfold": tf})})


@pytest.mark.parametrize("name", ["recipe-head.toml", "recipe-worker.toml"])
def test_the_recipe_fits_a_spark_with_the_reserve(tmp_path: Path, name: str) -> None:
    plan = budget(recipe(tmp_path, name), spark(tmp_path))
    items = {item.name: round(item.gib, 2) for item in plan.items}
    assert items["weights"] == round(CHECKPOINT / 2 / 1024**3, 2) == 81.96
    assert items["KV window"] == 9.38  # 1,048,576 tokens of FP8 rows
    assert items["KV pool"] == 12.5 and items["drafter"] == 2.0 and items["shm"] == 2.0
    assert items["activations"] == 2.0  # 4 requests: the allowance alone
    assert ("vision" in items) == (name == "recipe-head.toml")  # the tower sits on rank 0
    assert plan.reserve_gib == 9.0 and plan.usable_source == "MemTotal"
    assert plan.fits and 0 < plan.headroom_gib < 3, plan.sum_text()
    assert plan.sum_text().endswith("GiB of 112.7 usable (MemTotal 121.7 less the 9 reserve)")


def test_past_the_budget_says_by_how_much_and_what_to_change(tmp_path: Path) -> None:
    plan = budget(recipe(tmp_path, pool_gib=24.0), spark(tmp_path))
    assert not plan.fits
    over = -plan.headroom_gib
    assert 10 < over < 11
    advice = plan.advice()
    assert advice.startswith(f"win back {over:.1f} GiB: ")
    assert "lower engine.tensorfold.pool_gib to 13.5" in advice
    assert "lower memory.reserve_gib" not in advice  # the reserve (9) cannot give back 10.5
    assert "lower engine.context" not in advice  # nor can the 9.4 GiB window


def test_a_smaller_overshoot_offers_the_window_that_fits(tmp_path: Path) -> None:
    plan = budget(recipe(tmp_path, pool_gib=14.0), spark(tmp_path))
    over = -plan.headroom_gib
    assert 0 < over < 1
    fitting = int((9.375 - over) * 1024**3 / 9_600) // 4096 * 4096
    assert f"lower engine.context to {fitting} or less" in plan.advice()
    assert f"lower memory.reserve_gib to {9 - over:.1f}" in plan.advice()


def test_the_cgroup_limit_wins_over_memtotal(tmp_path: Path) -> None:
    root = spark(tmp_path)
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/self/cgroup").write_text("4:memory:/machine/node\n1:name=systemd:/\n0::/\n")
    limits = root / "sys/fs/cgroup/memory"
    (limits / "machine/node").mkdir(parents=True)
    (limits / "memory.limit_in_bytes").write_text(f"{(1 << 63) - 4096}\n")  # v1's "no limit"
    (limits / "machine/memory.limit_in_bytes").write_text(f"{3 * 1024**3}\n")
    (limits / "machine/node/memory.limit_in_bytes").write_text(f"{4 * 1024**3}\n")
    assert usable_memory(root) == (3.0, "cgroup /machine memory.limit_in_bytes")
    (root / "proc/self/cgroup").write_text("0::/system.slice\n")
    (root / "sys/fs/cgroup/system.slice").mkdir(parents=True)
    (root / "sys/fs/cgroup/system.slice/memory.max").write_text("max\n")
    have, source = usable_memory(root)  # v2 "max" is no limit
    assert source == "MemTotal" and have == pytest.approx(121.69, abs=0.01)


def test_preflight_refuses_past_the_budget_naming_the_numbers(tmp_path: Path) -> None:
    settings = recipe(tmp_path, pool_gib=24.0)
    report = preflight(settings, root=spark(tmp_path), machine="aarch64", run=_nothing)
    [check] = [c for c in report.checks if c.name == "memory_budget"]
    assert not check.ok
    assert "the engine does not fit this node: weights 82.0 + KV window 9.4 + KV pool 24.0" in check.detail
    assert "GiB over" in check.detail and "lower engine.tensorfold.pool_gib to 13.5" in check.fix
    assert report.facts["budget"]["fits"] is False
    assert report.facts["budget"]["items"]["KV pool"] == 24.0


_nothing: Runner = lambda argv: subprocess.CompletedProcess(list(argv), 127, "", "not here")  # noqa: E731


def test_weights_not_here_yet_wait_for_the_start(tmp_path: Path) -> None:
    settings = load(EXAMPLES / "recipe-worker.toml")
    plan = budget(settings, spark(tmp_path))
    assert plan.unknown.startswith("the weights are not under /var/lib/sparkfold/models/")
    assert plan.item("weights") is None


def test_json_carries_the_sum(tmp_path: Path) -> None:
    plan = budget(recipe(tmp_path), spark(tmp_path))
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["sum"] == plan.sum_text() and data["fits"] is True
    assert data["limit_gib"] == pytest.approx(112.69, abs=0.01)
