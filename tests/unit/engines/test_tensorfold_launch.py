"""The exact command, environment and docker argv of both ranks of the example Spark pair.

The golden files under golden/ are what `sparkfold engine --dry-run` must print for
examples/spark-pair/{head,worker}.toml. After a deliberate change, regenerate them with
``SPARKFOLD_UPDATE_GOLDEN=1 pytest tests/unit/engines/test_tensorfold_launch.py`` and review the diff.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from sparkfold.config import Settings, load, parse
from sparkfold.engines.tensorfold.launch import (
    FabricFacts,
    LaunchError,
    docker_stop_argv,
    follower_ready_s,
    health_is_ready,
    launch_plan,
    progress_note,
    rank_command,
    serving_line,
)

GOLDEN = Path(__file__).parent / "golden"
FACTS = FabricFacts("enp1s0f1np1", ("rocep1s0f1", "roceP2p1s0f1"), 3)


def example(repo: Path, name: str) -> Settings:
    return load(repo / f"examples/spark-pair/{name}.toml")


def with_changes(settings: Settings, **sections: dict[str, Any]) -> Settings:
    data = settings.model_dump(mode="json", exclude_none=True)
    for section, values in sections.items():
        target = data
        for part in section.split("."):
            target = target.setdefault(part, {})
        target.update(values)
    return parse(data)


@pytest.mark.parametrize("name", ["head", "worker"])
def test_example_pair_matches_golden(repo: Path, name: str) -> None:
    settings = example(repo, name)
    plan = launch_plan(settings, FabricFacts.from_settings(settings.fabric))
    actual = {"argv": list(plan.argv), "env": dict(sorted(plan.rank_env.items()))}
    golden = GOLDEN / f"{name}.docker.json"
    if os.environ.get("SPARKFOLD_UPDATE_GOLDEN"):
        golden.write_text(json.dumps(actual, indent=2) + "\n")
    assert actual == json.loads(golden.read_text())
    assert plan.env == {}  # docker: the rank's environment travels as -e arguments only


def test_the_container_is_capped_at_the_memory_budget_and_pays_first(repo: Path) -> None:
    argv = list(launch_plan(example(repo, "head"), FACTS, memory_bytes=112 << 30).argv)
    assert argv[argv.index("--memory") + 1] == str(112 << 30)
    assert argv[argv.index("--oom-score-adj") + 1] == "1000"  # the guard's and the kernel's first choice
    assert "--memory" not in launch_plan(example(repo, "head"), FACTS).argv  # no budget: no cap


def test_both_ranks_share_everything_but_rank_and_link(repo: Path) -> None:
    head = launch_plan(example(repo, "head"), FACTS)
    worker = launch_plan(example(repo, "worker"), FACTS)
    assert (
        head.command[: head.command.index("--rank") + 1]
        == worker.command[: worker.command.index("--rank") + 1]
    )
    # both ranks name rank 0's link address as the master
    assert head.command[head.command.index("--master") + 1] == "203.0.113.1"
    assert worker.command[worker.command.index("--master") + 1] == "203.0.113.1"
    assert head.rank_env == worker.rank_env  # same facts in, same environment out
    assert "--port" in head.command and "--port" not in worker.command  # rank 1 has no HTTP port
    assert head.health_url == "http://127.0.0.1:18888/health" and worker.health_url is None


def test_fabric_facts_from_settings_need_all_three(repo: Path) -> None:
    settings = example(repo, "head")
    assert FabricFacts.from_settings(settings.fabric) == FACTS
    assert FACTS.rails == 2
    partial = with_changes(settings, fabric={"gid_index": None})
    assert FabricFacts.from_settings(partial.fabric) is None
    with pytest.raises(LaunchError, match="fabric facts are missing"):
        launch_plan(partial, None)


def test_optional_flags_and_extra_args_come_from_config(repo: Path) -> None:
    settings = with_changes(
        example(repo, "worker"),
        **{
            "engine": {"thinking": False},
            "engine.tensorfold": {
                "drafter": "/var/lib/sparkfold/models/GLM-5.3-Flash-DFlash2",
                "mtp_drafts": 0,
                "reasoning_effort": "high",
                "thinking_budget": 2048,
                "memory_reserve_gib": 14.5,
                "nccl_channels": 0,
                "extra_args": ["--context", "131072"],
                "env": {"NCCL_DEBUG": "WARN", "HF_HUB_OFFLINE": "0"},
            },
        },
    )
    plan = launch_plan(settings, FACTS)
    command = " ".join(plan.command)
    assert "--drafter /var/lib/sparkfold/models/GLM-5.3-Flash-DFlash2" in command
    assert "--no-thinking --reasoning-effort high --thinking-budget 2048 --mtp-drafts 0" in command
    assert command.endswith("--context 131072")  # extra args go last, so they win
    assert plan.rank_env["TENSORFOLD_MEMORY_RESERVE_GIB"] == "14.5"
    assert plan.rank_env["NCCL_DEBUG"] == "WARN" and plan.rank_env["HF_HUB_OFFLINE"] == "0"  # env wins
    assert "NCCL_MIN_NCHANNELS" not in plan.rank_env
    drafter = "/var/lib/sparkfold/models/GLM-5.3-Flash-DFlash2"
    assert f"{drafter}:{drafter}:ro" in plan.argv


def test_host_launcher_runs_the_command_with_the_environment(repo: Path, tmp_path: Path) -> None:
    settings = with_changes(
        example(repo, "head"),
        **{"engine.tensorfold": {"launcher": "host", "kernel_cache_dir": str(tmp_path)}},
    )
    plan = launch_plan(settings, FACTS)
    assert plan.argv == plan.command and plan.argv[:2] == ("tensorfold", "serve")
    assert plan.container is None
    assert plan.env["TORCH_EXTENSIONS_DIR"] == str(tmp_path / "host/torch_extensions")
    assert plan.env["NCCL_IB_HCA"] == "=rocep1s0f1,roceP2p1s0f1"
    assert plan.directories == (tmp_path / "host",)


def test_kernel_cache_follows_the_image(repo: Path) -> None:
    settings = example(repo, "head")
    a = launch_plan(settings, FACTS, image_key="0123456789ab")
    b = launch_plan(settings, FACTS, image_key="ba9876543210")
    assert a.directories != b.directories
    assert "/var/cache/sparkfold/tensorfold/0123456789ab:/cache" in a.argv


def test_single_rank_has_no_rendezvous(repo: Path) -> None:
    settings = with_changes(example(repo, "head"), engine={"tp": 1})
    command = rank_command(settings)
    assert "--tp" not in command and "--master" not in command
    assert "NCCL_IB_HCA" not in launch_plan(settings, None).rank_env


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"engine": {"kind": "transformers"}}, 'engine.kind is "transformers"'),
        ({"engine": {"model": "models/glm"}}, "engine.model must be an absolute directory"),
    ],
)
def test_unusable_settings_name_the_key(repo: Path, change: dict[str, Any], message: str) -> None:
    with pytest.raises(LaunchError, match=message):
        launch_plan(with_changes(example(repo, "head"), **change), FACTS)


def test_gpus_and_rdma_can_be_left_out_of_the_docker_argv(repo: Path) -> None:
    """The testbed's stand-in uses neither; a real pair's default (both) is the golden argv above."""
    settings = with_changes(example(repo, "head"), **{"engine.tensorfold": {"gpus": False, "rdma": False}})
    argv = launch_plan(settings, FACTS).argv
    for gone in ("--gpus", "/dev/infiniband", "memlock=-1", "IPC_LOCK"):
        assert gone not in argv
    assert f"stack={67_108_864}" in argv and argv[argv.index("--network") + 1] == "host"
    only_gpus = with_changes(example(repo, "head"), **{"engine.tensorfold": {"rdma": False}})
    assert "--gpus" in launch_plan(only_gpus, FACTS).argv


def test_docker_stop_uses_the_configured_timeout(repo: Path) -> None:
    assert docker_stop_argv(example(repo, "head")) == ["docker", "stop", "-t", "30", "sparkfold-engine"]


def test_readiness_lines_and_health() -> None:
    assert follower_ready_s("[tensorfold] rank 1 ready in 212.4 s, following rank 0") == 212.4
    assert follower_ready_s("[tensorfold] rank 1 finished loading; waiting for rank 0 (60 s)") is None
    line = (
        "[tensorfold] serving GLM-5.3-Flash-EXL3 at http://127.0.0.1:18888/v1 on CUDA, rank 0 of 2 "
        "(sampling: t 1.0; drafts: off; prompts: bf16; context: 196608; loaded in 297 s)"
    )
    served = serving_line(line)
    assert served is not None and (served.name, served.url, served.world) == (
        "GLM-5.3-Flash-EXL3",
        "http://127.0.0.1:18888",
        2,
    )
    assert serving_line("[tensorfold] rank 1 ready in 1 s, following rank 0") is None
    assert health_is_ready({"ok": True}) and not health_is_ready({"ok": "true"})
    assert not health_is_ready({"status": "ok"}) and not health_is_ready([])
    assert progress_note("[tensorfold] building CUDA extension exl3_linear (first start ...)") == (
        "compiling CUDA kernels (exl3_linear); the first start is slow"
    )
    assert progress_note("nothing to see") is None


def test_example_pair_is_valid_and_shares_one_engine_section(repo: Path) -> None:
    from sparkfold.config import engine_differences, engine_fingerprint

    head, worker = example(repo, "head"), example(repo, "worker")
    assert (head.node.rank, worker.node.rank) == (0, 1)
    assert (
        engine_differences(head.engine.model_dump(mode="json"), worker.engine.model_dump(mode="json")) == []
    )
    assert engine_fingerprint(head) == engine_fingerprint(worker)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"drafter": "incoai/GLM-5.3-Flash-DFlash2"}, 'drafter must be "none" or an absolute directory'),
        ({"env": {"BAD-NAME": "1"}}, "not an environment variable name: BAD-NAME"),
        ({"launcher": "podman"}, "engine.tensorfold.launcher"),
        ({"shm_size": "16 GB"}, "engine.tensorfold.shm_size"),
    ],
)
def test_bad_tensorfold_settings_are_refused(repo: Path, values: dict[str, Any], message: str) -> None:
    from sparkfold.config import ConfigError

    with pytest.raises(ConfigError, match=message):
        with_changes(example(repo, "head"), **{"engine.tensorfold": values})


def test_dry_run_text_pastes_back_to_the_same_argv(repo: Path) -> None:
    import shlex

    plan = launch_plan(example(repo, "head"), FACTS)
    lines = plan.as_text().splitlines()
    assert lines[0] == "# rank 0, docker launcher"
    assert tuple(shlex.split(lines[1])) == plan.argv
    assert "NCCL_IB_HCA==rocep1s0f1,roceP2p1s0f1" in lines
    assert plan.as_dict()["argv"] == list(plan.argv)
