"""The GPU benchmark's pairing rules (``tests/bench/server_vs_direct.py``), on synthetic rounds."""

from __future__ import annotations

import json
from pathlib import Path

from tests.bench.server_vs_direct import _ratios, compare, verdict


def rounds(server: list[float], direct: list[float], tokens: tuple[int, int] = (384, 384)) -> dict[str, list]:
    return {
        "server": [{"tok_s": s, "tokens": tokens[0]} for s in server],
        "direct": [{"tok_s": d, "tokens": tokens[1]} for d in direct],
    }


def test_a_ratio_is_shown_only_where_the_effect_exceeds_the_spread() -> None:
    assert verdict(0.80, 0.78, 0.83) == "0.80 (0.78–0.83)"
    assert verdict(0.97, 0.90, 1.10).startswith("– (0.90–1.10: spread > effect)")
    assert verdict(0.86, 0.85, 1.02).startswith("– (0.85–1.02: spread > effect)")  # 1 in the range


def test_a_range_within_five_percent_of_one_is_parity_not_a_missing_ratio() -> None:
    assert verdict(1.01, 0.97, 1.04) == "≈ 1 (0.97–1.04: parity within ±5 %)"
    assert verdict(0.98, 0.95, 1.06).startswith("–")  # reaches past +5 %: not shown either way


def test_rounds_of_unequal_work_give_no_ratio() -> None:
    unequal = _ratios(rounds([100, 100], [100, 100], tokens=(253, 384)))
    assert unequal["equal_work"] is False
    assert verdict(
        unequal["ratio"], unequal["ratio_min"], unequal["ratio_max"], unequal["equal_work"]
    ).startswith("–")
    assert _ratios(rounds([90, 92], [100, 100]))["equal_work"] is True


def test_runs_side_by_side_agree_or_not(tmp_path: Path) -> None:
    def run(name: str, ratios: dict[int, float]) -> Path:
        rows = [{"concurrent": c, "ratio": r, "equal_work": True} for c, r in ratios.items()]
        path = tmp_path / name
        path.write_text(json.dumps({"levels": rows}))
        return path

    rows = compare([run("a.json", {1: 0.80, 8: 0.67}), run("b.json", {1: 0.82, 8: 1.10})])
    assert rows[2] == "| 1 | 0.80 / 0.82 | yes | 0.81 (0.80–0.82) |"
    assert rows[3].startswith("| 8 | 0.67 / 1.10 | no | – (0.67–1.10")
