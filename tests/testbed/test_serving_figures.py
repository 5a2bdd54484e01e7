"""Preflight on the testbed sees what a serving Spark shows: little memory left while a rank runs.

A serving GLM rank holds ~80 GiB, leaving ~8 GiB ``MemAvailable``. Each node's ``/proc/meminfo``
is overlaid (a bind mount inside the node) with those figures, and preflight is asked for 12 GiB:
a re-run of the serving pair goes through with nothing changed (the ranks' own memory is not
"missing"), while a node whose rank is stopped is refused, in words, before anything changes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from testbed_kit import HEAD, WORKER, Run, overlay_meminfo, play, ssh, wait_for

# One testbed per session: the first test also waits for the first converge (minutes on a busy host).
pytestmark = [pytest.mark.testbed, pytest.mark.slow, pytest.mark.netns, pytest.mark.timeout(1800)]
GIB_KB = 1024 * 1024
# MemTotal stays the node's own: the service stage caps the engine unit at the memory budget's limit
# (MemTotal less the reserve), and a Spark's MemTotal does not move while its rank serves.
SERVING_SPARK = {"MemFree": 2 * GIB_KB, "MemAvailable": 8 * GIB_KB}
NEEDS = {"sparkfold_preflight_min_memory_gib": 12}


@pytest.fixture(scope="module")
def serving_spark_memory(first_converge: Run, artifacts: Path) -> Iterator[None]:
    """Once for the module (its second test would re-run the same converge, changing nothing)."""
    # The engine unit's ExecStartPre checks the same thresholds (SPARKFOLD_MIN_MEMORY_GIB): put them
    # in place while the nodes still show their own memory, and let the restarted ranks settle.
    first_converge.must_succeed()
    play(artifacts / "serving-figures", "site.yml", extravars=NEEDS).must_succeed()
    wait_for("both ranks serving", engines_active, timeout_s=600, every_s=3)
    for node in (HEAD, WORKER):
        fake = overlay_meminfo(ssh(node, "cat /proc/meminfo"), SERVING_SPARK)
        ssh(node, "cat > /run/serving-meminfo && mount --bind /run/serving-meminfo /proc/meminfo", stdin=fake)
    try:
        yield
    finally:
        for node in (HEAD, WORKER):
            ssh(node, "umount /proc/meminfo; rm -f /run/serving-meminfo", check=False)


def engines_active() -> bool:
    return all(
        ssh(node, "systemctl is-active sparkfold-engine", check=False) == "active" for node in (HEAD, WORKER)
    )


def test_a_serving_pair_re_runs_with_a_serving_sparks_memory(
    serving_spark_memory: None, converge: Callable[..., Run]
) -> None:
    assert ssh(WORKER, "grep MemAvailable /proc/meminfo").split()[1] == str(8 * GIB_KB)
    run = converge(extravars=NEEDS).must_succeed()
    assert sum(run.changed.values()) == 0, f"changed: {run.changed}"


def test_a_stopped_rank_is_refused_with_a_serving_sparks_memory(
    serving_spark_memory: None, converge: Callable[..., Run]
) -> None:
    ssh(WORKER, "systemctl stop sparkfold-engine")
    try:
        run = converge(tags="preflight", extravars=NEEDS)
        assert run.rc != 0
        words = " ".join(run.output.split())
        assert "sftb-worker" in words and "only 8.0 GiB memory available (need 12)" in words, words[-3000:]
    finally:
        # Its memory back (the overlay off), or ExecStartPre would refuse the start in the same words.
        ssh(WORKER, "umount /proc/meminfo", check=False)
        ssh(WORKER, "systemctl start --no-block sparkfold-engine")
        wait_for("the worker's rank back", engines_active, timeout_s=600, every_s=3)
