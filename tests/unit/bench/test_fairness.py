"""The fairness suite's arithmetic on a fake clock (``sparkfold.bench.fairness``)."""

from __future__ import annotations

import pytest

from sparkfold.bench.fairness import Phase, figures, gaps, percentile, ratios
from sparkfold.bench.report import markdown


def _ticks(start: float, every: float, count: int) -> list[float]:
    return [round(start + i * every, 6) for i in range(count)]


def test_gaps_count_when_they_overlap_the_window() -> None:
    times = [0.0, 0.1, 0.2, 1.2, 1.3, 5.0]
    # [1.0, 2.0]: the stall 0.2 → 1.2 straddles the start, 1.2 → 1.3 is inside, 1.3 → 5.0 straddles the end
    assert gaps(times, 1.0, 2.0) == pytest.approx([1.0, 0.1, 3.7])
    assert gaps(times, 10.0, 11.0) == []
    assert gaps([3.0], 0.0, 10.0) == []


def test_percentile_is_the_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.5) == 50.0
    assert percentile(values, 0.99) == 99.0
    assert percentile([7.0], 0.99) == 7.0
    assert percentile([], 0.5) is None


def _phase(stall_at: float | None) -> Phase:
    """Two streams ticking every 50 ms over 0–10 s; with ``stall_at``, both stall 600 ms there
    and the short requests sent in the stall wait for it to end."""
    phase = Phase(start=2.0, end=8.0)
    for lane in range(2):
        ticks = _ticks(0.0 + lane * 0.01, 0.05, 201)
        if stall_at is not None:
            ticks = [t for t in ticks if not stall_at < t < stall_at + 0.6]
        phase.replies.append(ticks)
    for k in range(12):  # a short request every 0.5 s from 2.0 s, answered in 40 ms …
        sent = 2.0 + 0.5 * k
        waits = 0.04
        if stall_at is not None and stall_at <= sent < stall_at + 0.6:
            waits = stall_at + 0.6 - sent + 0.04  # … or once the stall is over
        phase.shorts.append((sent, sent + waits))
    phase.shorts.append((1.0, 1.04))  # before the window: not counted
    phase.shorts.append((7.9, None))  # never answered: counted as failed
    return phase


def test_figures_and_ratios_of_a_stalled_phase_against_a_steady_one() -> None:
    steady, stalled = figures(_phase(None)), figures(_phase(4.0))
    assert steady["short_requests"] == 12 and steady["short_failed"] == 1
    assert steady["short_ttft_p50_s"] == pytest.approx(0.04)
    assert steady["gap_max_s"] == pytest.approx(0.05)
    assert stalled["gap_max_s"] == pytest.approx(0.6 + 0.05, abs=1e-6)  # the tick before to the one after
    assert stalled["short_ttft_p99_s"] == pytest.approx(0.64)  # sent at 4.0, answered at 4.64
    assert stalled["short_ttft_p50_s"] == pytest.approx(0.04)
    ratio = ratios(stalled, steady)
    assert ratio["gap_max_s"] == pytest.approx(13.0, rel=1e-3)
    assert ratio["short_ttft_p99_s"] == pytest.approx(16.0, rel=1e-3)
    assert ratios({"gap_max_s": 1.0}, {"gap_max_s": None})["gap_max_s"] is None


def test_the_trace_is_relative_to_the_window_and_the_table_says_the_ratio() -> None:
    steady, stalled = _phase(None), _phase(4.0)
    trace = stalled.trace()
    assert trace["window_s"] == 6.0 and trace["shorts"][0] == [0.0, 0.04]
    suite = {
        "streams": 2,
        "interval_s": 0.5,
        "long_tokens": 8_000,
        "long_ttft_s": 6.0,
        "baseline": figures(steady),
        "loaded": figures(stalled),
        "ratio": ratios(figures(stalled), figures(steady)),
        "errors": 0,
        "seconds": 20.0,
    }
    result = {
        "model": "m",
        "url": "u",
        "started": "now",
        "window": 8192,
        "knobs": {"max_tokens": 64, "rounds": 1},
        "suites": {"fairness": suite},
    }
    table = markdown(result)
    assert "| during a 8,000-token prefill (6.00 s) | 40 ms | 0.64 s | 0.65 s |" in table
    assert "| ratio | 1.00× | 16.00× | 13.00× |" in table
