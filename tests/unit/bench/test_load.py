"""``sparkfold bench``: bounded load against a scripted engine, counted as it was streamed."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from click.testing import CliRunner
from tests.fakes.scripted_engine import Script, ScriptedEngine, ServerThread

from sparkfold.bench.load import run_load
from sparkfold.cli import main

TOKENS = ["one", " two", " three", " four", " five"]


@pytest.fixture
def engine() -> Iterator[tuple[ScriptedEngine, str]]:
    fake = ScriptedEngine(Script(content=TOKENS, pace_s=0.005))
    with ServerThread(fake) as server:
        yield fake, server.url


def test_each_level_runs_its_requests_and_counts_every_token(engine: tuple[ScriptedEngine, str]) -> None:
    fake, url = engine
    levels = run_load(url, concurrency=[1, 3], requests=3, max_tokens=8, max_seconds=30)
    assert [(r.concurrency, r.requests, r.errors) for r in levels] == [(1, 3, 0), (3, 3, 0)]
    fake.wait_for(lambda: fake.completed == 6)  # the server counts a stream just after its last byte
    for level in levels:
        assert level.ttft_p50_ms is not None and level.ttft_p50_ms > 0
        assert level.stream_tok_s_p50 is not None and level.stream_tok_s_p50 > 0
        # every token of every stream reached the client
        assert level.aggregate_tok_s * level.wall_s == pytest.approx(3 * len(TOKENS))
    assert all(r["stream"] is True and r["max_tokens"] == 8 for r in fake.requests)


def test_refusals_are_errors_and_the_command_exits_1(engine: tuple[ScriptedEngine, str]) -> None:
    fake, url = engine
    fake.queue(Script(status=503))
    result = CliRunner().invoke(main, ["bench", url, "--concurrency", "1", "--requests", "2", "--json"])
    assert result.exit_code == 1
    (level,) = json.loads(result.output)
    assert (level["requests"], level["errors"]) == (2, 1)
    assert "HTTP 503" in level["error_samples"][0]


def test_bad_levels_are_a_usage_error() -> None:
    result = CliRunner().invoke(main, ["bench", "http://127.0.0.1:1", "--concurrency", "0,x"])
    assert result.exit_code == 2
    assert "comma-separated list" in result.output
