from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from sparkfold.cli import main

PAIR = """
[node]
rank = {rank}
[fabric]
address = "{address}"
peer = "{peer}"
rendezvous_port = 29600
[engine]
kind = "{kind}"
model = "smollm2"
tp = 2
context = 4096
max_tokens = 64
"""


def _config(tmp_path: Path, rank: int = 1, kind: str = "transformers") -> str:
    address, peer = ("203.0.113.129", "203.0.113.130")[:: 1 if rank == 0 else -1]
    path = tmp_path / "sparkfold.toml"
    path.write_text(PAIR.format(rank=rank, address=address, peer=peer, kind=kind))
    return str(path)


def test_dry_run_json_names_rank_addresses_and_model(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["engine", "--config", _config(tmp_path), "--dry-run", "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)
    assert plan["rank"] == 1 and plan["tp"] == 2 and plan["serve"] is None
    assert plan["rendezvous"] == "203.0.113.129:29600"  # rank 0's address is the master
    assert plan["heartbeat"]["listen"] == "203.0.113.130:29601"
    assert plan["model"].endswith("SmolLM2-135M-Instruct.Q4_1.gguf")


def test_dry_run_text_for_rank_0(repo: Path) -> None:
    result = CliRunner().invoke(main, ["engine", "--config", str(repo / "examples/local.toml"), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "http://127.0.0.1:18888/v1" in result.output and "transformers" in result.output


def test_the_gpu_engine_without_cuda_is_one_clear_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["engine", "--config", _config(tmp_path, 0, "exllamav3")])
    assert result.exit_code == 1
    assert 'engine.kind = "exllamav3" needs an NVIDIA GPU with CUDA' in result.output
    assert "Traceback" not in result.output


def test_dry_run_when_fabric_discovery_fails_is_one_clear_line(tmp_path: Path, monkeypatch) -> None:
    from sparkfold.node import tensorfold_rank
    from sparkfold.node.checks import Check, Report

    def no_link(*_args: object, **_kwargs: object) -> Report:
        report = Report()
        report.add(Check("route", False, "203.0.113.129 is reached through a gateway", "address the link"))
        return report

    monkeypatch.setattr(tensorfold_rank, "discover", no_link)
    result = CliRunner().invoke(main, ["engine", "--config", _config(tmp_path, 0, "tensorfold"), "--dry-run"])
    assert result.exit_code == 1
    assert "fabric discovery found no RoCE link for NCCL: FAIL route" in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
