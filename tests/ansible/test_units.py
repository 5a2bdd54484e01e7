"""What the engine unit needs on a real pair, read from the units the example inventory renders:
Docker (tensorfold), a start timeout that covers the rank's own wait, and a restart back-off that
works on DGX OS (systemd 255) and Debian 12 (252)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from local_head import ansible

from sparkfold.config import TensorfoldSettings


def render(repo: Path, folder: Path, *extra: str) -> dict[str, str]:
    """The example inventory's head units (``render.yml``), ``-e`` options in ``extra``."""
    args = ["-i", "inventory/example", "tests/ansible/render.yml", "-e", f"render_dir={folder}"]
    for value in extra:
        args += ["-e", value]
    result = ansible(repo, "ansible-playbook", *args)
    assert result.returncode == 0, result.stdout + result.stderr
    return {
        name: (folder / "spark-head" / f"sparkfold-{name}.service").read_text() for name in ("engine", "api")
    }


def directives(unit: str, key: str) -> list[str]:
    return [line.split("=", 1)[1] for line in unit.splitlines() if line.startswith(f"{key}=")]


def test_the_tensorfold_engine_unit_reaches_docker(repo: Path, tmp_path: Path) -> None:
    units = render(repo, tmp_path)
    engine = units["engine"]
    assert "docker.service" in " ".join(directives(engine, "After"))
    assert "docker.service" in " ".join(directives(engine, "Wants"))
    assert directives(engine, "SupplementaryGroups") == ["docker"]
    # The gateway never gets Docker's group: only the unit that runs containers does.
    assert not directives(units["api"], "SupplementaryGroups")


@pytest.mark.parametrize(
    "extra",
    ["sparkfold_engine=transformers", '{"sparkfold_engine_tensorfold": {"launcher": "host"}}'],
    ids=["cpu-engine", "host-launcher"],
)
def test_an_engine_without_docker_neither_waits_for_it_nor_gets_its_group(
    repo: Path, tmp_path: Path, extra: str
) -> None:
    engine = render(repo, tmp_path, extra)["engine"]
    assert "docker" not in engine.replace("docker launcher", "")
    assert directives(engine, "After") == ["network-online.target"]


def test_a_host_launcher_rank_may_lock_memory_for_rdma(repo: Path, tmp_path: Path) -> None:
    host = render(repo, tmp_path / "host", '{"sparkfold_engine_tensorfold": {"launcher": "host"}}')["engine"]
    assert directives(host, "LimitMEMLOCK") == ["infinity"]
    # In the image, docker run's --ulimit memlock=-1 gives the container its limit
    # (engines/tensorfold/launch.py).
    assert not directives(render(repo, tmp_path / "docker")["engine"], "LimitMEMLOCK")


def test_the_start_timeout_covers_the_ranks_own_wait(repo: Path, tmp_path: Path) -> None:
    default_wait = TensorfoldSettings.model_fields["ready_timeout_s"].default
    [timeout] = directives(render(repo, tmp_path)["engine"], "TimeoutStartSec")
    assert int(timeout) > default_wait
    longer = json.dumps({"sparkfold_engine_tensorfold": {"ready_timeout_s": 3600.5}})
    [timeout] = directives(render(repo, tmp_path, longer)["engine"], "TimeoutStartSec")
    assert int(timeout) > 3600.5


def test_the_roles_default_ready_timeout_is_the_runtimes(repo: Path) -> None:
    vars_text = (repo / "roles/sparkfold/vars/main.yml").read_text()
    found = re.search(r"ready_timeout_s \| default\((\d+)\)", vars_text)
    assert found, "roles/sparkfold/vars/main.yml no longer defaults ready_timeout_s"
    assert float(found.group(1)) == TensorfoldSettings.model_fields["ready_timeout_s"].default


def test_restarts_back_off_on_systemd_254_and_later(repo: Path, tmp_path: Path) -> None:
    engine = render(repo, tmp_path, "render_systemd='systemd 255 (255.4-1ubuntu8)'")["engine"]
    assert directives(engine, "RestartSec") == ["5"]
    assert directives(engine, "RestartSteps") == ["6"]
    assert directives(engine, "RestartMaxDelaySec") == ["300"]
    assert directives(engine, "StartLimitIntervalSec") == ["0"]  # never gives up on the peer


def test_debian_12_gets_a_fixed_delay_and_no_unknown_keys(repo: Path, tmp_path: Path) -> None:
    engine = render(repo, tmp_path, "render_systemd='systemd 252 (252.39-1~deb12u2)'")["engine"]
    assert directives(engine, "RestartSec") == ["5"]
    assert not directives(engine, "RestartSteps") and not directives(engine, "RestartMaxDelaySec")
    assert directives(engine, "StartLimitIntervalSec") == ["0"]


def test_execstartpre_checks_the_inventorys_preflight_thresholds(repo: Path, tmp_path: Path) -> None:
    """The unit's preflight asks what the provisioning asked (not the engine kind's defaults)."""
    from sparkfold.commands.preflight_cmd import command

    envvars = {param.name: param.envvar for param in command.params}
    assert not [
        e for e in directives(render(repo, tmp_path)["engine"], "Environment") if "SPARKFOLD_MIN" in e
    ]
    knobs = '{"sparkfold_preflight_min_memory_gib": 100, "sparkfold_preflight_testbed_arch": "x86_64"}'
    engine = render(repo, tmp_path, knobs)["engine"]
    environment = directives(engine, "Environment")
    assert f"{envvars['min_memory_gib']}=100.0" in environment
    assert f"{envvars['testbed_arch']}=x86_64" in environment
    assert not [e for e in environment if e.startswith(str(envvars["min_disk_gib"]))]  # 0: the kind's default
