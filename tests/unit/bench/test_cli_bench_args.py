"""tests/bench/exllamav3_cli_bench.py passes what follows ``--`` to ``sparkfold bench``."""

from __future__ import annotations

from tests.bench.exllamav3_cli_bench import split_at_dashes


def test_options_after_the_dashes_go_to_sparkfold_bench() -> None:
    argv = ["MODEL", "OUT", "--context", "1048576", "--", "--suite", "prefill,reuse", "--label", "1M window"]
    assert split_at_dashes(argv) == (
        ["MODEL", "OUT", "--context", "1048576"],
        ["--suite", "prefill,reuse", "--label", "1M window"],
    )
    assert split_at_dashes(["MODEL", "OUT"]) == (["MODEL", "OUT"], [])
