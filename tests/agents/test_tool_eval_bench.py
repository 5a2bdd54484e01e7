"""tool-eval-bench (pinned in pyproject's dev extra) against the gateway in front of the real tiny
GLM-5.3 model on CPU, in both of its wire formats: every scenario is graded, none is refused by the
endpoint, and the forced-call scenario (``tool_choice: "required"``) finds the constraint enforced.

Scores are not gated: the model's weights are random. The protocol is: what tool-eval-bench sends
(many tools, multi-turn tool results, forced calls) must be answered. ``--short`` (the 15 core
scenarios) and the forced-call scenario run in CI; the full set is ``slow`` (``make test-all``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.integration.engine_procs import ChildProcess, free_port, serving, wait_healthy

pytestmark = pytest.mark.agents

FORMATS = ("openai", "anthropic")
FORCED_SCENARIO = "TC-45"
"""The scenario that sets ``tool_choice: "required"`` (tool_eval_bench.evals.scenarios.agentic.tc45)."""
SERVED = "glm"
REPLY_TOKENS = 40
"""Each reply's cap (tool-eval-bench asks for 16,384): enough for a call, so a scenario stays short."""
THINKING = {
    "openai": {"thinking_budget": 12},
    "anthropic": {"thinking": {"type": "enabled", "budget_tokens": 12}},
}
"""Thinking on (the default), its reasoning closed after 12 tokens: the random model would reason on
to the cap, and a forced call follows only the reasoning."""
TURNS = "2"
"""At most two model turns a scenario (its default: 8): a call, its result, an answer."""


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """The tiny GLM's engine (thinking on, its window raised) behind ``sparkfold api``; its log."""
    from sparkfold.testing.tiny_glm import write_tiny_glm

    tmp = tmp_path_factory.mktemp("tool-eval-bench")
    model = write_tiny_glm(tmp / "model")
    engine_port, port = free_port(), free_port()
    config = tmp / "sparkfold.toml"
    config.write_text(
        "[node]\nrank = 0\n"
        f'[engine]\nkind = "transformers"\nmodel = "{model}"\nserved_name = "{SERVED}"\n'
        f"port = {engine_port}\ncontext = 32768\nparallel = 1\n"
        f'[api]\nhost = "127.0.0.1"\nport = {port}\nparallel = 1\n'
    )
    with serving(config, tmp / "engine.log", engine_port):
        api = ChildProcess(
            [sys.executable, "-c", "from sparkfold.cli import main; main()", "api", "--config", str(config)],
            tmp / "gateway.log",
        )
        try:
            wait_healthy(f"http://127.0.0.1:{port}", api)
            yield f"http://127.0.0.1:{port}", tmp
        finally:
            api.stop()


def bench(url: str, tmp: Path, wire: str, *selection: str) -> dict[str, Any]:
    """One ``tool-eval-bench run`` (HOME and working directory in ``tmp``); its JSON report."""
    home = tmp / f"home-{wire}"
    home.mkdir(exist_ok=True)
    report = home / f"report-{'-'.join(selection)}.json"
    argv = [
        str(Path(sys.executable).with_name("tool-eval-bench")),
        "run",
        "--base-url", url,
        "--api-key", "unused",
        "--model", SERVED,
        "--format", wire,
        "--temperature", "0",
        "--seed", "1",
        "--timeout", "300",
        "--no-warmup",
        "--no-live",
        "--no-probe-engine",
        "--max-turns", TURNS,
        "--backend-kwargs", json.dumps({"max_tokens": REPLY_TOKENS, **THINKING[wire]}),
        "--json-file", str(report),
        *selection,
    ]  # fmt: skip
    env = {**os.environ, "HOME": str(home), "NO_COLOR": "1"}
    done = subprocess.run(argv, cwd=home, env=env, capture_output=True, text=True, timeout=1800)
    assert report.is_file(), f"{done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    data: dict[str, Any] = json.loads(report.read_text())
    return data


def refused(log: Path) -> list[tuple[str, int]]:
    """(path, status) of every API request the gateway answered with a 4xx or 5xx, from its access
    log (``/health``, polled while the gateway starts, is not the benchmark's)."""
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    access = [
        line
        for line in lines
        if line.get("logger") == "sparkfold.api.access" and line.get("path", "").startswith("/v1/")
    ]
    return [(line["path"], line["status"]) for line in access if not 200 <= line["status"] < 400]


def check_graded(report: dict[str, Any], count: int) -> list[dict[str, Any]]:
    """Every scenario ran and was graded on the model's answer, none on the endpoint's failure."""
    results: list[dict[str, Any]] = report["scores"]["scenario_results"]
    assert report["status"] == "completed" and len(results) == count, report["status"]
    for result in results:
        assert result["status"] in ("pass", "partial", "fail"), result
        assert result.get("failure_kind") not in INFRASTRUCTURE, (result["scenario_id"], result["summary"])
    return results


INFRASTRUCTURE = frozenset({"timeout", "connection_error", "server_error", "model_crash", "evaluator_error"})
"""tool-eval-bench's failure kinds that blame the serving side, not the model (its
``domain.scenarios.INFRASTRUCTURE_FAILURE_KINDS``, plus the evaluator's own)."""


@pytest.mark.timeout(1800)  # 12.5 min a format measured on 2 cores at load 8-10
@pytest.mark.parametrize("wire", FORMATS)
def test_the_short_set_is_answered_and_graded(gateway: tuple[str, Path], wire: str) -> None:
    url, tmp = gateway
    check_graded(bench(url, tmp, wire, "--short"), 15)
    forced = check_graded(bench(url, tmp, wire, "--scenarios", FORCED_SCENARIO), 1)[0]
    assert forced["diagnostics"]["tool_choice"].startswith("enforced by the endpoint"), forced
    assert forced["tool_calls_made"], forced  # the forced turn called a tool
    assert not refused(tmp / "gateway.log"), refused(tmp / "gateway.log")


@pytest.mark.slow
@pytest.mark.timeout(5400)
@pytest.mark.parametrize("wire", FORMATS)
def test_the_full_set_is_answered_and_graded(gateway: tuple[str, Path], wire: str) -> None:
    url, tmp = gateway
    report = bench(url, tmp, wire)
    check_graded(report, report["total_scenarios"])
    assert not refused(tmp / "gateway.log")
