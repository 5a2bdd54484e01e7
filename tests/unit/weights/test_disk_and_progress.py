"""The disk check counts only what is missing; progress lines are rate-limited."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from sparkfold.units import GIB
from sparkfold.weights.disk import check_space, free_bytes, missing_bytes
from sparkfold.weights.errors import DiskSpaceError
from sparkfold.weights.progress import Progress, human_bytes


def test_only_files_not_in_place_count() -> None:
    expected = [("a", 10), ("b", 20), ("c", 30)]
    assert missing_bytes(expected, {"a": 10, "b": 5}) == 20 + 30
    assert missing_bytes(expected, {"a": 10, "b": 20, "c": 30}) == 0


def test_not_enough_space_names_both_numbers_and_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(DiskSpaceError) as caught:
        check_space(tmp_path / "store", 150 * GIB, reserve_gib=5, free=lambda _: 100 * GIB)
    assert str(caught.value) == (
        f"{tmp_path / 'store'}: need 150.0 GiB more (and 5.0 GiB kept free), 100.0 GiB free: "
        "free space or choose another store"
    )


def test_enough_space_and_nothing_missing_pass(tmp_path: Path) -> None:
    assert check_space(tmp_path, 90 * GIB, reserve_gib=5, free=lambda _: 100 * GIB).ok
    assert check_space(tmp_path, 0, reserve_gib=5, free=lambda _: 0).ok


def test_free_space_of_a_directory_not_made_yet(tmp_path: Path) -> None:
    assert free_bytes(tmp_path / "not" / "yet") == free_bytes(tmp_path) > 0


def test_progress_prints_at_most_once_per_interval_then_the_last_line() -> None:
    now = [0.0]
    out = io.StringIO()
    progress = Progress("hash", 4 * GIB, interval_s=5, stream=out, clock=lambda: now[0])
    for _ in range(4):
        now[0] += 2
        progress.advance(GIB, "shard")
    progress.finish("4 files")
    lines = out.getvalue().splitlines()
    assert lines == [
        "hash: 3.0 GiB of 4.0 GiB (75%), 512.0 MiB/s, shard",
        "hash: 4.0 GiB of 4.0 GiB (100%), 512.0 MiB/s, 4 files",
    ]


def test_human_bytes() -> None:
    assert [human_bytes(n) for n in (5, 1536, 3 * GIB)] == ["5 B", "1.5 KiB", "3.0 GiB"]
