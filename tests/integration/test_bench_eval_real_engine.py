"""``sparkfold bench`` and ``sparkfold eval`` against the CPU demo pair: the real transformers
engine (SmolLM2-135M) in a child process and the gateway in front of it.

The numbers are whatever this machine gives; what is checked is that the commands run end to end
on a real engine: the tables, the JSON and the plots are written, every request is answered, and
HumanEval's sandbox scores the replies (the score is printed, not asserted).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from engine_procs import free_port, serving, write_config
from tests.fakes.harness import settings_for
from tests.fakes.scripted_engine import ServerThread

from sparkfold.api import create_app
from sparkfold.cli import main

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def gateway_url(smol_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    directory = tmp_path_factory.mktemp("engine")
    port = free_port()
    config = write_config(directory / "sparkfold.toml", smol_dir, port=port, max_tokens=128, parallel=2)
    with (
        serving(config, directory / "engine.log", port),
        ServerThread(create_app(settings_for(port, parallel=2, max_queued=8, keepalive_s=5))) as gateway,
    ):
        yield gateway.url


def test_bench_decode_and_reuse_write_table_json_and_plots(gateway_url: str, tmp_path: Path) -> None:
    args = ["bench", gateway_url, "--suite", "decode,reuse", "--plot", str(tmp_path), "--no-progress"]
    args += ["--concurrency", "1,2", "--rounds", "1", "--warmup", "0", "--max-tokens", "8"]
    args += ["--reuse-tokens", "600", "--system-tokens", "300"]
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "| Concurrent | Prose tok/s |" in (tmp_path / "bench.md").read_text()
    run = json.loads((tmp_path / "bench.json").read_text())
    assert run["model"] == "smol" and run["window"] == 2048
    for rows in run["suites"]["decode"]["levels"].values():
        assert all(r["errors"] == 0 and r["aggregate_tok_s"] > 0 for r in rows)
    resent, shared = run["suites"]["reuse"]["rows"]
    assert resent["prompt_tokens"] > 500 and shared["prompt_tokens"] > 250  # sized by the engine's tokenizer
    assert sorted(p.name for p in tmp_path.glob("*.png")) == ["decode.png", "reuse.png"]


def test_eval_humaneval_scores_a_handful_of_problems(gateway_url: str, tmp_path: Path) -> None:
    args = [
        "eval",
        gateway_url,
        "--suite",
        "humaneval",
        "--limit",
        "3",
        "--max-tokens",
        "128",
        "--max-seconds",
        "0",
    ]
    result = CliRunner().invoke(main, [*args, "--concurrency", "2", "--out", str(tmp_path), "--no-progress"])
    assert result.exit_code == 0, result.output
    print(result.output)  # the score: reported, not asserted
    report = json.loads((tmp_path / "humaneval.json").read_text())
    assert (report["problems"], report["errors"]) == (3, 0)
    assert [r["task_id"] for r in report["results"]] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    assert all(r["result"] for r in report["results"])  # each one ran in the sandbox and has a verdict
    assert f"pass@1 {report['pass_at_1']:.3f} ({report['passed']} of 3)" in result.output
