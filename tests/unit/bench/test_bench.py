"""``sparkfold bench``: suites against a scripted engine, the files they write, ``--compare``."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import matplotlib.image
import pytest
from click.testing import CliRunner
from tests.fakes.scripted_engine import Script, ScriptedEngine, ServerThread

from sparkfold.bench import suites
from sparkfold.bench.client import Endpoint, Reply
from sparkfold.bench.suites import prefill_lengths
from sparkfold.cli import main

TOKENS = ["one", " two", " three", " four", " five"]


@pytest.fixture
def engine() -> Iterator[tuple[ScriptedEngine, str]]:
    fake = ScriptedEngine(Script(content=TOKENS, pace_s=0.002))
    with ServerThread(fake) as server:
        yield fake, server.url


def bench(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["bench", *args, "--no-progress"], catch_exceptions=False)
    return result.exit_code, result.output


def quick(url: str, *more: str) -> list[str]:
    sizes = ["--reuse-tokens", "600", "--system-tokens", "300"]
    return [url, "--concurrency", "1,3", "--rounds", "1", "--warmup", "0", "--max-tokens", "8", *sizes, *more]


def png_width(path: Path) -> int:
    return int(matplotlib.image.imread(path).shape[1])


def chats(fake: ScriptedEngine) -> list[dict]:
    return [r for r in fake.requests if r["path"] == "/v1/chat/completions"]


@pytest.mark.slow
def test_decode_and_reuse_write_the_table_json_and_plots(
    engine: tuple[ScriptedEngine, str], tmp_path: Path
) -> None:
    fake, url = engine
    code, output = bench(*quick(url, "--suite", "decode,reuse", "--plot", str(tmp_path)))
    assert code == 0, output
    assert "| Concurrent | Prose tok/s | Prose per request | TTFT p50 / p90 |" in output
    assert (tmp_path / "bench.md").read_text().strip() in output
    result = json.loads((tmp_path / "bench.json").read_text())
    assert result["format"] == "sparkfold-bench/1" and result["model"] == "fake"
    decode = result["suites"]["decode"]
    assert decode["errors"] == 0
    for kind in ("prose", "structured"):
        rows = decode["levels"][kind]
        assert [(r["concurrency"], r["requests"]) for r in rows] == [(1, 1), (3, 3)]
        for row in rows:  # every token of every stream was counted (the usage block's count)
            assert row["aggregate_tok_s"] * row["wall_s"] == pytest.approx(row["requests"] * len(TOKENS))
            assert row["ttft_p50_ms"] > 0 and row["per_request_tok_s"] > 0
    # 2 × (1 + 3) decode streams and 4 reuse requests, each asking for the usage block
    sent = chats(fake)
    assert len(sent) == 12 and all(r["stream_options"] == {"include_usage": True} for r in sent)
    reuse = result["suites"]["reuse"]["rows"]
    assert [row["prompt"] for row in reuse] == [
        "identical 600-token prompt resent",
        "new conversation, same 300-token system prompt",
    ]
    assert all(row["first_s"] > 0 and row["next_s"] > 0 for row in reuse)
    resent = [r["messages"][0]["content"] for r in sent[-4:-2]]
    assert resent[0] == resent[1] and len(resent[0].split()) > 590
    shared = [r["messages"] for r in sent[-2:]]
    assert shared[0][0] == shared[1][0] and shared[0][1] != shared[1][1]
    plots = sorted(p.name for p in tmp_path.glob("*.png"))
    assert plots == ["decode.png", "reuse.png"]
    assert all(png_width(tmp_path / name) >= 800 for name in plots)


def test_a_run_cut_short_keeps_the_suites_it_finished(
    engine: tuple[ScriptedEngine, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bench.json / bench.md (and --save) are written after every suite, not only at the end."""
    import sparkfold.bench.run as run_module

    measured = run_module.run_suite

    async def until_reuse(name: str, *args: Any) -> dict[str, Any]:
        if name == "reuse":  # the run is stopped here (an outer time limit, Ctrl-C)
            raise KeyboardInterrupt
        return await measured(name, *args)

    monkeypatch.setattr(run_module, "run_suite", until_reuse)
    saved = tmp_path / "saved.json"
    args = quick(engine[1], "--suite", "decode,reuse", "--plot", str(tmp_path), "--save", str(saved))
    code, output = bench(*args)
    assert code == 1 and "Aborted" in output
    for path in (tmp_path / "bench.json", saved):
        result = json.loads(path.read_text())
        assert list(result["suites"]) == ["decode"] and result["suites"]["decode"]["errors"] == 0
    assert "## Decode" in (tmp_path / "bench.md").read_text()


@pytest.mark.slow
def test_compare_draws_two_saved_runs(engine: tuple[ScriptedEngine, str], tmp_path: Path) -> None:
    _, url = engine
    for name in ("a", "b"):
        code, output = bench(*quick(url, "--suite", "decode,reuse", "--save", str(tmp_path / f"{name}.json")))
        assert code == 0, output
    out = tmp_path / "cmp"
    code, output = bench("--compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--plot", str(out))
    assert code == 0, output
    assert "| Prompts | Concurrent | a tok/s | b tok/s | B / A |" in output
    assert len([line for line in output.splitlines() if line.startswith(("| prose", "| structured"))]) == 4
    assert sorted(p.name for p in out.glob("*.png")) == ["compare-decode.png", "compare-reuse.png"]


def test_compare_refuses_a_file_that_is_not_a_bench_run(tmp_path: Path) -> None:
    other = tmp_path / "other.json"
    other.write_text('{"levels": []}')
    code, output = bench("--compare", str(other), str(other))
    assert code == 1 and "not a sparkfold bench result" in output


def test_refusals_are_counted_and_the_command_exits_1(engine: tuple[ScriptedEngine, str]) -> None:
    fake, url = engine
    fake.queue(Script(status=503))
    code, output = bench(*quick(url, "--suite", "decode", "--concurrency", "1", "--rounds", "2", "--json"))
    assert code == 1
    decode = json.loads(output)["suites"]["decode"]
    row = decode["levels"]["prose"][0]
    assert (row["requests"], row["errors"], decode["errors"]) == (2, 1, 1)
    assert "HTTP 503" in row["error_samples"][0]


def test_warmup_requests_run_first_unmeasured_and_their_errors_still_count(
    engine: tuple[ScriptedEngine, str],
) -> None:
    fake, url = engine
    fake.queue(Script(status=503))  # the first request sent: a warm-up one
    args = quick(url, "--suite", "decode", "--concurrency", "1,3", "--rounds", "2", "--warmup", "1", "--json")
    code, output = bench(*args)
    assert code == 1  # an error, even in a warm-up request, is never hidden
    decode = json.loads(output)["suites"]["decode"]
    first, second = decode["levels"]["prose"]
    assert (first["warmup_requests"], first["requests"], first["errors"]) == (1, 2, 1)
    assert "HTTP 503" in first["error_samples"][0]
    # the measured numbers are the measured requests' only: both prose ×1 replies streamed in full
    assert first["aggregate_tok_s"] * first["wall_s"] == pytest.approx(2 * len(TOKENS))
    assert (second["warmup_requests"], second["requests"], second["errors"]) == (3, 6, 0)
    assert decode["errors"] == 1
    assert len(chats(fake)) == 2 * ((1 + 2) + (3 + 6))
    assert (
        "rounds per level (after 2 unmeasured)" in bench(*quick(url, "--suite", "decode", "--warmup", "2"))[1]
    )


def test_exact_finds_a_concurrent_reply_that_differs(engine: tuple[ScriptedEngine, str]) -> None:
    fake, url = engine
    # the 4 serial replies, then the burst: one of its replies differs from its serial twin
    fake.queue(*[Script(content=TOKENS)] * 5, Script(content=["one", " TWO"]))
    code, output = bench(url, "--suite", "exact", "--time-budget", "0", "--json")
    assert code == 0, output
    exact = json.loads(output)["suites"]["exact"]
    assert exact["burst"] == {"same": 3, "compared": 4}
    assert exact["staggered"] == {"same": 4, "compared": 4}
    # which burst request got the odd reply depends on arrival order at the engine
    assert [(m["mode"], m["at_char"]) for m in exact["mismatches"]] == [("burst", 5)]
    sent = chats(fake)
    assert len(sent) == 12 and all(r["temperature"] == 0 and r["seed"] == 0 for r in sent)


def test_prefill_runs_each_length_and_skips_what_does_not_fit(engine: tuple[ScriptedEngine, str]) -> None:
    fake, url = engine
    code, output = bench(
        url, "--suite", "prefill", "--prefill-lengths", "1k,2k,1m", "--window", "8192", "--json"
    )
    assert code == 0, output
    rows = json.loads(output)["suites"]["prefill"]["rows"]
    assert [r["target_tokens"] for r in rows] == [1024, 2048, 1_048_576]
    assert rows[0]["tok_s"] > 0 and rows[1]["tok_s"] > 0
    assert rows[2]["skipped"] == "does not fit the 8,192-token window"
    sizes = [len(r["messages"][0]["content"].split()) for r in chats(fake)]
    assert sizes[0] == pytest.approx(1024, abs=5) and sizes[1] == pytest.approx(2048, abs=5)


# TTFT by prompt length of `sparkfold bench --suite prefill` against the engine server on a lent H100
# with the 1,048,576-token window (docs/data/h100-2026-12-06/cli-bench-window.json, rounded)
H100_TTFT_S = {
    8192: 0.24,
    16384: 0.72,
    32768: 1.06,
    65536: 1.14,
    131072: 1.79,
    262144: 4.13,
    524288: 6.17,
    1_048_320: 17.34,
}


def prefill_on_the_h100(monkeypatch: pytest.MonkeyPatch, max_seconds: float) -> list[dict[str, Any]]:
    """The prefill suite's rows against an endpoint that takes the H100's TTFTs, on a fake clock."""
    clock = [0.0]

    async def long_prompt(client: Any, endpoint: Endpoint, tokens: int, per_word: float, seed: int) -> Any:
        clock[0] += H100_TTFT_S[tokens]
        return "", Reply(ok=True, ttft_s=H100_TTFT_S[tokens], prompt_tokens=tokens)

    async def one_token_a_word(client: Any, model: str) -> float:
        return 1.0

    monkeypatch.setattr(suites, "_long", long_prompt)
    monkeypatch.setattr(suites, "tokens_per_word", one_token_a_word)
    monkeypatch.setattr(suites, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    knobs = suites.Knobs(max_seconds=max_seconds, progress=False)
    endpoint = Endpoint(url="http://127.0.0.1:1", model="glm", window=1_048_576)
    return asyncio.run(suites.prefill(None, endpoint, knobs))["rows"]  # type: ignore[arg-type]


def test_prefill_goes_on_to_the_window_while_the_measured_rate_says_the_next_length_fits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the default budget's prefill share (96 s): every length to the window (it stopped at 128k)
    rows = prefill_on_the_h100(monkeypatch, 96.0)
    assert [r["target_tokens"] for r in rows if "tok_s" in r] == list(H100_TTFT_S)
    # 4.75 s left after 512k, which went at ~85k tok/s: the window's ~12 s is not started
    rows = prefill_on_the_h100(monkeypatch, 20.0)
    assert [r["target_tokens"] for r in rows if "tok_s" in r] == list(H100_TTFT_S)[:-1]
    assert rows[-1]["skipped"] == "time limit: ~12 s at 84,974 tok/s, 5 s left"


def test_prefill_lengths_double_from_8k_up_to_the_window() -> None:
    assert prefill_lengths(1_048_576, None) == [8192 * 2**i for i in range(7)] + [1_048_320]
    assert prefill_lengths(40_000, None) == [8192, 16384, 32768]
    assert prefill_lengths(4096, None) == [960, 1920, 3840]


def test_bad_input_is_a_usage_error() -> None:
    for args, message in (
        (["--concurrency", "0,x"], "comma-separated list"),
        (["--suite", "speed"], "choose from"),
    ):
        code, output = bench("http://127.0.0.1:1", *args)
        assert code == 2 and message in output
    code, output = bench()
    assert code == 2 and "give the endpoint's URL" in output


def test_a_time_budget_sizes_the_unset_knobs_by_a_first_request_and_says_so(tmp_path: Path) -> None:
    fake = ScriptedEngine(Script(content=TOKENS, pace_s=0.02))  # ~50 tok/s on one stream
    with ServerThread(fake) as server:
        args = [server.url, "--suite", "decode,exact", "--time-budget", "6", "--plot", str(tmp_path)]
        code, output = bench(*args)
    assert code == 0, output
    assert "tok/s on one stream: decode at 1,4 streams, 1 round(s), warm-up 0, 16-token replies" in output
    assert "s left" in output  # the estimate after each suite
    result = json.loads((tmp_path / "bench.json").read_text())
    assert result["plan"]["max_tokens"] == 16 and result["knobs"]["levels"] == [1, 4]
    assert [r["max_tokens"] for r in chats(fake)[1:]][:1] == [16]  # after the probe: the planned budget
    assert (tmp_path / "decode.png").is_file()
