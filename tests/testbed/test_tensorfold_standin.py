"""The ``tensorfold`` engine kind end to end on the testbed, image stage included, and its drills.

The same two nodes the other modules converged are re-converged with
``-e @inventory/testbed-tensorfold.yml``, the shape of inventory/example's default: each node pulls
the TensorFold stand-in (tests/fakes/fake_tensorfold.py) by digest from the registry
``playbooks/testbed.yml`` serves on the control host, the image role accepts it by its recipe label
(tf.patches) and each node's ``sparkfold-engine`` runs its rank with ``docker run`` and the recipe's
settings: rank 0 on the head behind the gateway (4 lanes), rank 1 on the worker, with the recipe's
peer watch on. A wrong label or digest stops the image stage naming both. Then the drills, each
recovering unattended within a bounded wait: Docker stopped on the worker, the worker's rank
killed, the worker node restarted.

Runs after every other testbed module (file order) and leaves the pair on the tensorfold kind.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from testbed_kit import (
    HEAD,
    REPO,
    WORKER,
    Run,
    chat_answers,
    chat_reply,
    invocations,
    play,
    ssh,
    stream_chat,
    unit,
    wait_for,
)

# One testbed per session: the first test also waits for the first converge (minutes on a busy host).
pytestmark = [pytest.mark.testbed, pytest.mark.slow, pytest.mark.netns, pytest.mark.timeout(1800)]
TENSORFOLD: dict[str, Any] = yaml.safe_load((REPO / "inventory/testbed-tensorfold.yml").read_text())
IMAGE = "sparkfold-tensorfold:v0.6.0-recipe"
RECIPE_LABEL = TENSORFOLD["sparkfold_image_published_label"]
STANDIN_REPLY = "Hello from the fake engine."  # tests/fakes/fake_tensorfold.py REPLY
# When the node's systemd started (its own clock since the boot): another value is another boot.
BOOTED = "systemctl show -p UserspaceTimestampMonotonic --value"


def engines_up() -> bool:
    return (
        all(
            ssh(node, "systemctl is-active sparkfold-engine", check=False) == "active"
            for node in (HEAD, WORKER)
        )
        and ssh(HEAD, "systemctl is-active sparkfold-api", check=False) == "active"
    )


def serves(api_key: str) -> None:
    """Both ranks up and the gateway answering through them (bounded)."""
    wait_for("both tensorfold ranks and the gateway active", engines_up, timeout_s=600, every_s=3)
    wait_for(
        "the gateway to answer through the stand-in", lambda: chat_answers(api_key), timeout_s=300, every_s=3
    )


def container(node: str) -> dict[str, Any]:
    """``docker inspect`` of the node's rank container."""
    return dict(json.loads(ssh(node, "docker inspect sparkfold-engine"))[0])


@pytest.fixture(scope="module")
def tensorfold_pair(first_converge: Run, artifacts: Path) -> Run:
    first_converge.must_succeed()
    return play(artifacts / "tensorfold-1", "site.yml", extravars=TENSORFOLD)


@pytest.fixture
def converge_tensorfold(
    tensorfold_pair: Run, artifacts: Path, request: pytest.FixtureRequest
) -> Callable[..., Run]:
    tensorfold_pair.must_succeed()
    counter = iter(range(1000))

    def run(**kwargs: Any) -> Run:
        name = f"{request.node.name}-{next(counter)}"
        return play(artifacts / name, "site.yml", extravars=TENSORFOLD, **kwargs)

    return run


def published() -> str:
    """The stand-in's reference by digest, as playbooks/testbed.yml published it (session fixture ran)."""
    return (REPO / ".cache/testbed/standin-image/published.ref").read_text().strip()


def test_the_tensorfold_kind_pulls_its_image_by_digest_and_serves_through_the_gateway(
    tensorfold_pair: Run, api_key: str
) -> None:
    run = tensorfold_pair.must_succeed()
    words = " ".join(run.output.split())
    assert "WARNING: TESTBED OVERRIDE" in words  # the architecture override is never silent
    serves(api_key)
    assert chat_reply(api_key) == STANDIN_REPLY
    # The image stage pulled the published image by digest on both nodes, accepted by its label.
    ref = published()
    name, digest = ref.split("@")
    assert ref.startswith("198.51.100.1:5000/") and digest.startswith("sha256:")
    for node in (HEAD, WORKER):
        image = json.loads(ssh(node, f"docker image inspect {IMAGE}"))[0]
        assert image["Config"]["Labels"]["tf.patches"] == RECIPE_LABEL
        assert f"{name.rsplit(':', 1)[0]}@{digest}" in image["RepoDigests"]
    profile = ssh(HEAD, "cat /etc/sparkfold/tensorfold-image.toml")
    assert "kv_fp8" in profile and f"published {ref}" in profile
    # Rank 0 on the head, rank 1 on the worker, each in its container, the recipe's peer watch on.
    for node, rank in ((HEAD, "0"), (WORKER, "1")):
        rank_container = container(node)
        args = rank_container["Args"]
        assert args[args.index("--rank") + 1] == rank and args[args.index("--master") + 1] == "203.0.113.1"
        env = set(rank_container["Config"]["Env"])
        assert {"TENSORFOLD_PEER_TIMEOUT_S=20", "FAKE_TENSORFOLD_RENDEZVOUS=1"} <= env
        assert rank_container["HostConfig"]["DeviceRequests"] in (None, [])  # gpus = false: no --gpus
        journal = ssh(node, "journalctl -u sparkfold-engine -o cat --no-pager")
        assert "TESTBED OVERRIDE" in journal  # ExecStartPre's preflight says it at every start


def test_four_streams_run_at_once_through_the_gateway(tensorfold_pair: Run, api_key: str) -> None:
    """The recipe's 4 lanes: four streamed requests held open together (the stand-in's FAKE-HOLD)
    are all running in the engine at once, then each streams to its end once released."""
    serves(api_key)
    # The engine's own port, on the head's loopback (the nodes have python3, not curl).
    engine = 'python3 -c "import sys, urllib.request as u; print(u.urlopen(u.Request('
    health = engine + "'http://127.0.0.1:18888/health'), timeout=10).read().decode())\""
    release = engine + "'http://127.0.0.1:18888/fake/release', data=b'{}'), timeout=10).read().decode())\""
    assert json.loads(ssh(HEAD, health))["requests_running"] == 0
    ends: list[str] = []

    def stream() -> None:
        lines: list[str] = []
        stream_chat(api_key, lines, prompt="FAKE-HOLD: say hello.", max_tokens=8)
        ends.extend(line for line in lines if line == "data: [DONE]")

    streams = [threading.Thread(target=stream) for _ in range(4)]
    for thread in streams:
        thread.start()
    try:
        wait_for(
            "four requests running in the engine at once",
            lambda: json.loads(ssh(HEAD, health))["requests_running"] == 4,
            timeout_s=120,
            every_s=1,
        )
    finally:
        ssh(HEAD, release)
        for thread in streams:
            thread.join(timeout=120)
    assert ends == ["data: [DONE]"] * 4


def test_a_wrong_label_or_digest_stops_the_image_stage_naming_both(
    tensorfold_pair: Run, artifacts: Path, api_key: str
) -> None:
    """Nothing is tagged or restarted: the pair serves on from the accepted image."""
    serves(api_key)
    before = invocations()
    profile = "cat /etc/sparkfold/tensorfold-image.toml"
    profiles = {node: ssh(node, profile) for node in (HEAD, WORKER)}
    ref = published()
    name, digest = ref.split("@")
    label = play(
        artifacts / "tf-wrong-label",
        "playbooks/image.yml",
        extravars={**TENSORFOLD, "sparkfold_image_published_label": "0123456789ab"},
    )
    assert label.rc != 0
    words = " ".join(label.output.split())
    assert f"{ref} carries tf.patches={RECIPE_LABEL}, not 0123456789ab" in words
    other = "sha256:" + "0" * 64
    missing = play(
        artifacts / "tf-wrong-digest",
        "playbooks/image.yml",
        extravars={**TENSORFOLD, "sparkfold_image_registry_ref": f"{name}@{other}"},
    )
    assert missing.rc != 0
    words = " ".join(missing.output.split())
    assert f"No image with digest {other} (to be accepted with tf.patches={RECIPE_LABEL})" in words
    for node in (HEAD, WORKER):
        image = json.loads(ssh(node, f"docker image inspect {IMAGE}"))[0]
        assert image["Config"]["Labels"]["tf.patches"] == RECIPE_LABEL
    assert invocations() == before
    # The profile still names the image that runs (it is written once the image is in place).
    assert {node: ssh(node, profile) for node in (HEAD, WORKER)} == profiles
    assert digest != other


def test_a_second_converge_at_vvv_changes_nothing_and_prints_no_key(
    tensorfold_pair: Run, converge_tensorfold: Callable[..., Run], api_key: str
) -> None:
    serves(api_key)
    before = invocations()
    run = converge_tensorfold(verbosity=3).must_change_nothing()
    assert invocations() == before, "a converge that changed nothing restarted a unit"
    assert "ESTABLISH SSH CONNECTION" in run.output  # it is -vvv output
    assert api_key not in run.output, "the API key is in the -vvv output"


def rank_restarted(node: str, before: str) -> Callable[[], bool]:
    def probe() -> bool:
        now = unit(node, "sparkfold-engine")
        return now["InvocationID"] != before and now["ActiveState"] == "active"

    return probe


def test_drill_stop_docker_on_the_worker(tensorfold_pair: Run, api_key: str) -> None:
    serves(api_key)
    before = unit(WORKER, "sparkfold-engine")["InvocationID"]
    # The socket too, or the next docker command would start the daemon again at once.
    ssh(WORKER, "systemctl stop docker.socket docker.service")
    wait_for(
        "the worker's rank restarted (its unit wants docker)", rank_restarted(WORKER, before), timeout_s=300
    )
    assert ssh(WORKER, "systemctl is-active docker") == "active"
    serves(api_key)


def test_drill_kill_the_worker_rank_leaves_no_stale_container(tensorfold_pair: Run, api_key: str) -> None:
    serves(api_key)
    before = unit(WORKER, "sparkfold-engine")
    old_container = container(WORKER)["Id"]
    ssh(WORKER, f"kill -9 {before['MainPID']}")  # the supervisor; its container lives on for now
    wait_for("the worker's rank restarted", rank_restarted(WORKER, before["InvocationID"]), timeout_s=300)
    serves(api_key)
    assert container(WORKER)["Id"] != old_container


def test_drill_restart_the_worker_node(tensorfold_pair: Run, artifacts: Path, api_key: str) -> None:
    serves(api_key)
    pidfile = REPO / ".cache/testbed/run/sftb-worker.pid"
    pid = int(pidfile.read_text())
    assert b"systemd-nspawn" in Path(f"/proc/{pid}/cmdline").read_bytes()
    booted = ssh(WORKER, BOOTED)
    os.kill(pid, 15)  # SIGTERM to nspawn: the machine shuts down cleanly
    wait_for(
        "the worker machine to stop", lambda: not Path(f"/proc/{pid}").exists(), timeout_s=120, every_s=1
    )
    play(artifacts / "boot-worker", "playbooks/testbed.yml").must_succeed()  # boots what is not running
    assert int(pidfile.read_text()) != pid
    assert ssh(WORKER, BOOTED) != booted  # a new boot of the machine, not the old one answering
    serves(api_key)  # the worker's rank started at boot (enabled) and the head's rank met it again
