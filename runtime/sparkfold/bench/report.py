"""A bench run as markdown tables shaped like the reference recipe's, row by row comparable.

Decode: ``Concurrent | Prose tok/s | Prose per request | TTFT | Structured tok/s | Structured per
request | TTFT`` (TTFT as p50 / p90); prefill: ``Prompt tokens | Prefill tok/s | TTFT``; reuse:
``Prompt | First | Next``; exact: how many concurrent replies equal the serial ones; fairness:
``Phase | Short TTFT p50 | p99 | Longest decode gap | Gap p99`` without and with the long prompt,
and their ratio. Every table is followed by its error count.
"""

from __future__ import annotations

from typing import Any

__all__ = ["comparison", "markdown"]


def _num(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def _ms(p50: float | None, p90: float | None) -> str:
    if p50 is None:
        return "–"
    return f"{p50:,.0f} ms" if p90 is None else f"{p50:,.0f} / {p90:,.0f} ms"


def _s(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f} s" if value >= 0.1 else f"{value * 1000:.0f} ms"


def _errors(suite: dict[str, Any]) -> str:
    line = f"Errors: {suite.get('errors', 0)}"
    samples = suite.get("error_samples") or []
    return line + ("" if not samples else " (" + "; ".join(samples) + ")")


def _decode(suite: dict[str, Any]) -> list[str]:
    kinds = suite["levels"]
    lines = [
        "| Concurrent | Prose tok/s | Prose per request | TTFT p50 / p90 "
        "| Structured tok/s | Structured per request | TTFT p50 / p90 |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for prose, structured in zip(kinds["prose"], kinds["structured"], strict=True):
        cells = [str(prose["concurrency"])]
        for row in (prose, structured):
            cells += [
                _num(row["aggregate_tok_s"]),
                _num(row["per_request_tok_s"]),
                _ms(row["ttft_p50_ms"], row["ttft_p90_ms"]),
            ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _table(left: list[str], right: list[str], rows: list[list[str]]) -> list[str]:
    """A markdown table: the ``left`` columns left-aligned, then the ``right`` ones right-aligned."""
    aligns = ["---"] * len(left) + ["---:"] * len(right)
    return ["| " + " | ".join(cells) + " |" for cells in (left + right, aligns, *rows)]


def _prefill(suite: dict[str, Any]) -> list[str]:
    def cells(row: dict[str, Any]) -> list[str]:
        tokens = f"{row.get('prompt_tokens') or row['target_tokens']:,}"
        if "tok_s" in row:
            return [tokens, _num(row["tok_s"]), _s(row["ttft_s"])]
        return [tokens, row.get("skipped") or f"error: {row.get('error')}", "–"]

    return _table([], ["Prompt tokens", "Prefill tok/s", "TTFT"], [cells(row) for row in suite["rows"]])


def _reuse(suite: dict[str, Any]) -> list[str]:
    def cells(row: dict[str, Any]) -> list[str]:
        if "first_s" not in row:
            return [row["prompt"], f"error: {row.get('error')}", "–", "–"]
        cached = "–" if row.get("cached_tokens") is None else f"{row['cached_tokens']:,}"
        return [row["prompt"], _s(row["first_s"]), _s(row["next_s"]), cached]

    head = ["First", "Next", "Cached tokens"]
    return _table(["Prompt"], head, [cells(row) for row in suite["rows"]])


def _exact(suite: dict[str, Any]) -> list[str]:
    lines = ["| Sent | Identical to serial |", "| --- | ---: |"]
    for mode in ("burst", "staggered"):
        lines.append(f"| {mode} | {suite[mode]['same']} / {suite[mode]['compared']} |")
    for miss in suite["mismatches"]:
        lines.append(
            f"| {miss['mode']}: request {miss['request']} differs from character {miss['at_char']} | |"
        )
    return lines


def _fairness(suite: dict[str, Any]) -> list[str]:
    def cells(name: str, row: dict[str, Any]) -> list[str]:
        return [
            name,
            _s(row["short_ttft_p50_s"]),
            _s(row["short_ttft_p99_s"]),
            _s(row["gap_max_s"]),
            _s(row["gap_p99_s"]),
            f"{row['short_requests']} / {row['gaps']}",
        ]

    ratio, base = suite["ratio"], suite["baseline"]
    long = f"during a {suite['long_tokens']:,}-token prefill ({_s(suite['long_ttft_s'])})"
    head = ["Short TTFT p50", "Short TTFT p99", "Longest decode gap", "Decode gap p99", "Shorts / gaps"]
    rows = [
        cells(f"{suite['streams']} streams, a short request every {suite['interval_s']:g} s", base),
        cells(long, suite["loaded"]),
        ["ratio", *(_num(ratio[k], 2) + ("×" if ratio[k] else "") for k in ratio), ""],
    ]
    return _table(["Phase"], head, rows)


_TABLES = {
    "decode": ("Decode", _decode),
    "prefill": ("Prefill", _prefill),
    "reuse": ("Prompt reuse", _reuse),
    "exact": ("Exactness (temperature 0)", _exact),
    "fairness": ("Fairness under a long prompt", _fairness),
}


def markdown(result: dict[str, Any]) -> str:
    """Every suite of ``result`` as a titled table with its error count."""
    knobs = result["knobs"]
    out = [
        f"# sparkfold bench: {result['model']} at {result['url']} ({result['started']})",
        "",
        f"{knobs['max_tokens']} tokens per decode request, {knobs['rounds']} rounds per level "
        f"(after {knobs.get('warmup', 0)} unmeasured), greedy; "
        f"window {result.get('window') or 'not listed'}.",
    ]
    for name, suite in result["suites"].items():
        title, table = _TABLES[name]
        out += ["", f"## {title}", "", *table(suite), "", _errors(suite) + f"; {suite['seconds']} s."]
    return "\n".join(out) + "\n"


def comparison(runs: list[tuple[str, dict[str, Any]]]) -> str:
    """Decode aggregate tok/s and TTFT p50 of two runs side by side, with B / A."""
    (label_a, a), (label_b, b) = runs
    if "decode" not in a["suites"] or "decode" not in b["suites"]:
        return ""
    lines = [
        f"| Prompts | Concurrent | {label_a} tok/s | {label_b} tok/s | B / A "
        f"| {label_a} TTFT p50 | {label_b} TTFT p50 |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for kind, rows_a in a["suites"]["decode"]["levels"].items():
        rows_b = {r["concurrency"]: r for r in b["suites"]["decode"]["levels"].get(kind, [])}
        for ra in rows_a:
            rb = rows_b.get(ra["concurrency"])
            if rb is None:
                continue
            ratio = rb["aggregate_tok_s"] / ra["aggregate_tok_s"] if ra["aggregate_tok_s"] else None
            lines.append(
                f"| {kind} | {ra['concurrency']} "
                f"| {_num(ra['aggregate_tok_s'])} | {_num(rb['aggregate_tok_s'])} "
                f"| {_num(ratio, 2)} | {_ms(ra['ttft_p50_ms'], None)} | {_ms(rb['ttft_p50_ms'], None)} |"
            )
    return "\n".join(lines) + "\n"
