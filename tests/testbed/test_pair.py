"""site.yml on the two-node testbed: converge, idempotence, check mode, restarts, drills.

The tests run in file order on one pair; each leaves the pair converged for the next.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable

import httpx
import pytest
from testbed_kit import (
    API,
    HEAD,
    NODES,
    WORKER,
    Run,
    chat_answers,
    invocations,
    restarts_issued,
    ssh,
    starts_since,
    unit,
    wait_for,
)

# One testbed per session: the first test also waits for the first converge (minutes on a busy host).
pytestmark = [pytest.mark.testbed, pytest.mark.slow, pytest.mark.netns, pytest.mark.timeout(1800)]
MODEL = "/var/lib/sparkfold/models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def test_first_converge_succeeds(first_converge: Run) -> None:
    first_converge.must_succeed()
    assert set(first_converge.stats.get("ok", {})) == NODES


def test_second_converge_changes_nothing(converge: Callable[..., Run]) -> None:
    before = invocations()
    converge().must_change_nothing()
    assert invocations() == before, "a converge that changed nothing restarted a unit"


def test_check_mode_reports_nothing_to_change(converge: Callable[..., Run]) -> None:
    converge(check=True).must_change_nothing()


def test_weights_copy_is_repaired_and_both_ranks_restart(converge: Callable[..., Run]) -> None:
    before = invocations()
    ssh(WORKER, f"truncate -s 1M {MODEL}")
    run = converge(tags="weights").must_succeed()
    assert run.changed.get("sftb-worker", 0) > 0 and run.changed.get("sftb-head", 0) > 0
    assert ssh(WORKER, f"sha256sum {MODEL}").split()[0] == ssh(HEAD, f"sha256sum {MODEL}").split()[0]
    # Only the worker's store changed, yet the pair restarts together: rank 0 must meet the new rank 1.
    after = invocations()
    assert after[f"{HEAD} engine"] != before[f"{HEAD} engine"]
    assert after["api"] == before["api"], "a weights change restarted the gateway"


def _units_active() -> bool:
    head = ssh(HEAD, "systemctl is-active sparkfold-engine sparkfold-api", check=False).split()
    return (
        head == ["active", "active"]
        and ssh(WORKER, "systemctl is-active sparkfold-engine", check=False) == "active"
    )


@pytest.fixture
def serving(api_key: str) -> None:
    """A converge restarts the worker's rank without waiting: let the pair settle first (bounded)."""
    wait_for("both engine units and the gateway active", _units_active, timeout_s=600, every_s=3)
    wait_for("the API to answer", lambda: chat_answers(api_key), timeout_s=600, every_s=5)


def test_units_are_active(serving: None) -> None:
    assert _units_active()


def test_openai_sdk_through_the_head(serving: None, api_key: str) -> None:
    assert chat_answers(api_key)


def test_gateway_change_restarts_only_the_api(serving: None, converge: Callable[..., Run]) -> None:
    engines = {node: unit(node, "sparkfold-engine")["MainPID"] for node in (HEAD, WORKER)}
    api_before = unit(HEAD, "sparkfold-api")["MainPID"]
    converge(tags="runtime,service", extravars={"sparkfold_api_max_queued": 17}).must_succeed()
    assert unit(HEAD, "sparkfold-api")["MainPID"] != api_before
    assert {node: unit(node, "sparkfold-engine")["MainPID"] for node in (HEAD, WORKER)} == engines
    # No converge back to the inventory's settings: the next test's full converge is one.


def test_one_converge_restarts_each_rank_once_worker_first(
    serving: None, converge: Callable[..., Run]
) -> None:
    # Two stages change the ranks in one run: the worker's weights (weights) and a setting (runtime).
    ssh(WORKER, f"truncate -s 1M {MODEL}")
    started = time.time()
    run = converge(extravars={"sparkfold_engine_max_tokens": 256}).must_succeed()
    assert restarts_issued(run, "Engine | restart on the worker", "sftb-worker") == 1, run.output[-4000:]
    assert restarts_issued(run, "Engine | restart on the head", "sftb-head") == 1, run.output[-4000:]
    assert starts_since(HEAD, "sparkfold-engine", started) == 1
    head, worker = unit(HEAD, "sparkfold-engine"), unit(WORKER, "sparkfold-engine")
    # One kernel, one monotonic clock: the two machines' start times compare directly.
    assert int(worker["ExecMainStartTimestampMonotonic"]) < int(head["ExecMainStartTimestampMonotonic"])
    # The setting stays for the drills below; test_serving_figures.py's full converge puts the
    # inventory's back (a converge each, ~90 s of the testbed phase, went to reverting these two).


def test_drill_kill_the_worker_engine(serving: None, api_key: str) -> None:
    before = unit(WORKER, "sparkfold-engine")["MainPID"]
    ssh(WORKER, f"kill -9 {before}")
    wait_for(
        "a new worker rank",
        lambda: unit(WORKER, "sparkfold-engine")["MainPID"] not in ("0", before),
    )
    wait_for("the API to answer again", lambda: chat_answers(api_key), timeout_s=600, every_s=5)
    assert ssh(HEAD, "systemctl is-active sparkfold-engine sparkfold-api").split() == ["active", "active"]


def _health() -> dict:
    try:
        return httpx.get(f"{API}/health", timeout=10).json()
    except (httpx.HTTPError, ValueError):
        return {}


def _peer_lost() -> bool:
    # The head's rank reports its peer lost, then exits (peer_timeout_s) and systemd restarts it; a
    # poll may land in either window, so an engine that is down counts too, as long as health is not ok.
    health = _health()
    peer_lost = (health.get("peer") or {}).get("state") == "lost"
    engine_down = (health.get("engine") or {}).get("ok") is False
    return health.get("ok") is False and (peer_lost or engine_down)


def test_drill_fabric_link_down(serving: None, api_key: str) -> None:
    link = ["ip", "-n", "sftb-worker", "link", "set", "sf-fabric0"]
    subprocess.run([*link, "down"], check=True)
    try:
        wait_for(
            "/health to report the peer lost",
            lambda: (
                (h := _health()).get("ok") is False and (h.get("peer") or {}).get("state") in ("lost", None)
            ),
            timeout_s=300,
        )
    finally:
        subprocess.run([*link, "up"], check=True)
    wait_for("the pair to serve again", lambda: chat_answers(api_key), timeout_s=600, every_s=5)
