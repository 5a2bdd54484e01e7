"""``sparkfold api``'s wiring: the engine start the gateway watches (a new rank: ask its capabilities)."""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from types import ModuleType

import pytest

from sparkfold.commands import api_cmd
from sparkfold.node import marker as node_serving


def test_the_engine_start_is_the_serving_ranks_pid_read_anew_each_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    marker: list[node_serving.Serving | None] = [None]
    monkeypatch.setattr(node_serving, "serving", lambda: marker[0])
    started = api_cmd._engine_start()
    assert started is not None
    assert started() is None  # no rank marked serving (stopped, or outside systemd)
    marker[0] = node_serving.Serving(fingerprint="f", pid=4242, rank=0)
    assert started() == 4242
    marker[0] = node_serving.Serving(fingerprint="f", pid=4343, rank=0)  # the unit restarted the rank
    assert started() == 4343


def test_the_marker_on_disk_names_the_pid(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the real marker: what the engine unit writes is what the gateway reads."""
    folder = tmp_path / "run" / "sparkfold-engine"
    folder.mkdir(parents=True)
    assert node_serving.write_record(
        node_serving.MARKER, {"fingerprint": "f", "rank": 0}, {"RUNTIME_DIRECTORY": str(folder)}
    )
    real = node_serving.serving
    monkeypatch.setattr(node_serving, "serving", lambda: real(tmp_path))
    (tmp_path / "proc").mkdir()
    started = api_cmd._engine_start()
    assert started is not None and started() is None  # the writer's pid is not running under this root
    (tmp_path / "proc" / str(os.getpid())).mkdir()
    assert started() == os.getpid()


def test_without_node_support_there_is_no_engine_start(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> ModuleType:
        if name == "sparkfold.node.marker":
            raise ImportError(name)
        return importlib.import_module(name)

    monkeypatch.setattr(api_cmd.importlib, "import_module", missing)
    assert api_cmd._engine_start() is None  # the gateway then never re-asks on its own


def test_the_engine_load_is_the_marker_s_load_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the engine unit writes at READY (its process age) is what the gateway's metric reads."""
    folder = tmp_path / "run" / "sparkfold-engine"
    folder.mkdir(parents=True)
    (tmp_path / "proc" / str(os.getpid())).mkdir(parents=True)
    real = node_serving.serving
    monkeypatch.setattr(node_serving, "serving", lambda: real(tmp_path))
    load = api_cmd._engine_load()
    assert load is not None and load() is None  # nothing marked serving
    assert node_serving.write_record(
        node_serving.MARKER,
        {"fingerprint": "f", "rank": 0, "load_s": 433.5, "start": "restart", "phases": {"warmup_s": 2.5}},
        {"RUNTIME_DIRECTORY": str(folder)},
    )
    found = load()
    assert (found.load_s, found.start, found.phases) == (433.5, "restart", {"warmup_s": 2.5})


def test_the_process_age_is_uptime_less_the_kernel_s_start_time(tmp_path: Path) -> None:
    ticks = os.sysconf("SC_CLK_TCK")
    (tmp_path / "self").mkdir()
    fields = ["S"] + ["0"] * 18 + [str(100 * ticks)] + ["0"] * 5  # field 22 (starttime): 100 s after boot
    (tmp_path / "self" / "stat").write_text(f"4242 (sparkfold (engine)) {' '.join(fields)}\n")
    (tmp_path / "uptime").write_text("537.50 1000.00\n")
    assert node_serving.process_age_s(tmp_path) == 437.5
    assert node_serving.process_age_s(tmp_path / "missing") is None
    age = node_serving.process_age_s()  # this very process, through the real /proc
    assert age is not None and age >= 0
