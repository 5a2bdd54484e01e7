"""``sparkfold.node.guard``: the guard's record, each kill reported once, saying what to change."""

from __future__ import annotations

from pathlib import Path

from node_fakes import settings

from sparkfold.node.guard import kills_path, new_kill_lines, read_kills


def node(tmp_path: Path) -> Path:
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/meminfo").write_text(f"MemTotal: {16 * 1024 * 1024} kB\n")
    (tmp_path / "m").mkdir()
    (tmp_path / "m/model.bin").write_bytes(b"\0" * 4096)
    return tmp_path


def test_each_kill_is_reported_once_with_the_setting_to_lower(tmp_path: Path) -> None:
    root = node(tmp_path)
    s = settings(
        engine={"model": "/m"}, paths={"state_dir": str(tmp_path / "state")}, memory={"reserve_gib": 4}
    )
    assert new_kill_lines(s, root) == []  # no record: the guard never acted
    record = kills_path(s)
    record.parent.mkdir(parents=True)
    record.write_text("1765000000 4242 python3\nnot a kill\n")
    [line] = new_kill_lines(s, root)
    assert line.startswith(
        "the memory guard killed the engine rank (pid 4242 'python3') at 2025-12-06 05:46:40 UTC"
    )
    assert "available memory fell below 2 GiB" in line
    # 16 GiB less the 4 reserve, 2 GiB footprint (activations): 10 headroom + 2 of the reserve
    assert "held at least 12.0 GiB more than its budget" in line and "win back 12.0 GiB" in line
    assert line.endswith("systemd restarts the rank")
    assert new_kill_lines(s, root) == []  # reported: not again at the next start
    with record.open("a") as more:
        more.write("1765000100 4343 tensorfold serve\n")
    [second] = new_kill_lines(s, root)
    assert "(pid 4343 'tensorfold serve')" in second
    assert [k.pid for k in read_kills(record)] == [4242, 4343]


def test_an_unreadable_record_is_no_kill(tmp_path: Path) -> None:
    assert read_kills(tmp_path / "absent") == []
