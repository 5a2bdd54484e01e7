"""``sparkfold startup``: systemd's marks, the supervisor's port record and the smoke's first token,
all from the unit's start."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from node_fakes import settings

from sparkfold.config import Settings
from sparkfold.node import marker as node_serving
from sparkfold.node.startup import FIRST_TOKEN_RECORD, gateway_url, startup, unit_start
from sparkfold.weights import build_manifest, default_manifest_path, write_manifest

PID = os.getpid()  # the unit's main process: alive, so the marker it "wrote" reads


def systemctl(start_us: int, ready_us: int, pid: int = PID, code: int = 0) -> Callable[..., Any]:
    def run(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        assert list(argv[:3]) == ["systemctl", "show", "sparkfold-engine.service"]
        out = (
            f"ExecMainStartTimestampMonotonic={start_us}\n"
            f"ActiveEnterTimestampMonotonic={ready_us}\nExecMainPID={pid}\n"
        )
        return subprocess.CompletedProcess(list(argv), code, out if code == 0 else "", "")

    return run


def gateway_on(host: str, rank: int = 0) -> Settings:
    if rank == 0:
        return settings(node={"rank": 0}, api={"host": host, "port": 8890})
    fabric = {"address": "203.0.113.2", "peer": "203.0.113.1"}
    return settings(node={"rank": rank}, engine={"tp": 2}, fabric=fabric, api={"host": host, "port": 8890})


def root_with_marker(tmp_path: Path, port_s: float | None) -> Path:
    (tmp_path / "proc" / str(PID)).mkdir(parents=True)
    folder = tmp_path / node_serving.RUN_DIR
    folder.mkdir(parents=True)
    record = {"fingerprint": "f", "rank": 0, "load_s": 437.0, "port_s": port_s}
    assert node_serving.write_record(node_serving.MARKER, record, {"RUNTIME_DIRECTORY": str(folder)})
    return tmp_path


def smoke_at(clock: list[float]) -> Callable[[Callable[[], object]], dict[str, Any]]:
    def send(on_first_token: Callable[[], object]) -> dict[str, Any]:
        on_first_token()
        return {"ok": True, "text": "OK", "ttft_s": 0.2}

    return send


def test_the_marks_are_seconds_from_the_unit_start(tmp_path: Path) -> None:
    root = root_with_marker(tmp_path, port_s=430.5)
    clock = [1000.0 + 440.25]
    found = startup(
        gateway_on("0.0.0.0"),
        smoke_at(clock),
        run=systemctl(1000_000_000, 1437_100_000),
        root=root,
        clock=lambda: clock[0],
    )
    assert (found.port_open_s, found.ready_s, found.first_token_s) == (430.5, 437.1, 440.25)
    assert found.as_dict()["line"] == (
        f"sparkfold-engine.service (rank 0, pid {PID}) from its start: port open 430.5 s, "
        "/health ready 437.1 s, first streamed token 440.2 s"
    )


def test_a_later_run_reports_the_same_start_s_first_token(tmp_path: Path) -> None:
    root = root_with_marker(tmp_path, port_s=None)
    run = systemctl(1000_000_000, 1437_100_000)
    first = startup(gateway_on("0.0.0.0"), smoke_at([0]), run=run, root=root, clock=lambda: 1440.0)
    again = startup(gateway_on("0.0.0.0"), smoke_at([0]), run=run, root=root, clock=lambda: 5000.0)
    assert first.first_token_s == again.first_token_s == 440.0
    assert (root / node_serving.RUN_DIR / FIRST_TOKEN_RECORD).is_file()
    restarted = startup(
        gateway_on("0.0.0.0"),
        smoke_at([0]),
        run=systemctl(4000_000_000, 4400_000_000, pid=PID + 1),
        root=root,
        clock=lambda: 4401.5,
    )
    assert restarted.first_token_s == 401.5  # a new start (another pid): its own first token
    assert restarted.port_open_s is None  # the marker names another process than the unit's


def test_the_worker_has_no_port_and_sends_nothing(tmp_path: Path) -> None:
    def never(on_first_token: Callable[[], object]) -> dict[str, Any]:
        raise AssertionError("rank 1 sends no smoke request")

    found = startup(gateway_on("0.0.0.0", rank=1), never, run=systemctl(5_000_000, 65_000_000), root=tmp_path)
    assert found.ready_s == 60.0 and found.smoke is None
    assert found.line().endswith("from its start: /health ready 60.0 s")


def test_without_the_unit_it_says_so(tmp_path: Path) -> None:
    found = startup(gateway_on("0.0.0.0"), None, run=systemctl(0, 0, code=1), root=tmp_path)
    assert found.problem == "systemd has no running sparkfold-engine.service on this node"
    assert unit_start(systemctl(0, 0)) is None  # never started: ExecMainStart is 0


def test_the_gateway_is_reached_on_loopback_from_a_wildcard_bind() -> None:
    assert gateway_url(gateway_on("0.0.0.0")) == "http://127.0.0.1:8890"
    assert gateway_url(gateway_on("::")) == "http://[::1]:8890"


def test_the_marker_records_when_the_port_first_answered(tmp_path: Path) -> None:
    import json
    import time

    env = {"RUNTIME_DIRECTORY": str(tmp_path)}
    opened = time.monotonic()
    path = node_serving.mark_serving(gateway_on("127.0.0.1"), env, port_open_at=opened)
    assert path is not None
    record = json.loads(path.read_text())
    assert 0 <= record["port_s"] <= record["load_s"]  # the port answered before READY, after the start
    without = node_serving.mark_serving(gateway_on("127.0.0.1"), env)
    assert without is not None and json.loads(without.read_text())["port_s"] is None


def test_with_a_drafter_the_line_gives_its_digest_and_the_smoke_s_acceptance(tmp_path: Path) -> None:
    drafting = settings(engine={"kind": "exllamav3", "exllamav3": {"drafter": "/models/dflash2"}})

    def send(on_first_token: Callable[[], object]) -> dict[str, Any]:
        on_first_token()
        return {"ok": True, "text": "OK", "drafted": 12, "accepted": 9}

    unfetched = startup(drafting, send, run=systemctl(1_000_000, 2_000_000), root=tmp_path, clock=lambda: 3.0)
    no_manifest = "drafter /models/dflash2 (no manifest): 9 of 12 drafted tokens accepted (75%)"
    assert unfetched.line().endswith(no_manifest)
    folder = tmp_path / "models/dflash2"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"drafter")
    manifest = build_manifest(folder)
    write_manifest(manifest, default_manifest_path(folder))  # what the weights stage leaves beside it
    found = startup(drafting, send, run=systemctl(1_000_000, 2_000_000), root=tmp_path, clock=lambda: 3.0)
    assert found.drafter_digest == manifest.digest
    wanted = f"drafter /models/dflash2 (digest {manifest.digest[:12]}): 9 of 12 drafted tokens accepted (75%)"
    assert found.line().endswith(wanted)
    silent = startup(drafting, smoke_at([0]), run=systemctl(1_000_000, 2_000_000), root=tmp_path)
    assert silent.line().endswith(f"(digest {manifest.digest[:12]}): drafts not reported by the engine")
    plain = startup(gateway_on("0.0.0.0"), send, run=systemctl(1_000_000, 2_000_000), root=tmp_path)
    assert "drafter" not in plain.line()  # none configured: no acceptance line


def test_the_smoke_request_reaches_the_chat_route_of_this_node_s_gateway() -> None:
    """`sparkfold startup --smoke` streams one chat through the gateway on loopback; its URL must
    be the gateway's root (the client adds /v1/...): with /v1 in it the request was a 404."""
    from tests.fakes.scripted_engine import ScriptedEngine, ServerThread

    from sparkfold.commands.startup_cmd import _smoke

    with ServerThread(ScriptedEngine()) as gateway:
        here = settings(node={"rank": 0}, api={"host": "0.0.0.0", "port": gateway.port})
        firsts: list[bool] = []
        report = _smoke(here, None, "Say hi.", 8, 30)(lambda: firsts.append(True))
    assert report["ok"], report["error"]
    assert firsts == [True] and report["text"]
