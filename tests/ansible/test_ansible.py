"""The Ansible side without any node: lint, syntax, role skeletons, and what the example renders."""

from __future__ import annotations

import ipaddress
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from local_head import ansible, render_example

from sparkfold.config import engine_fingerprint, load
from sparkfold.node.budget import budget
from sparkfold.weights.manifest import Manifest, ManifestFile, default_manifest_path

STAGES = ["preflight", "fabric", "image", "weights", "runtime", "service", "verify", "router"]
ROLES = [
    "sparkfold",
    *(f"sparkfold_{stage}" for stage in STAGES),
    "sparkfold_guard",
    "sparkfold_testbed",
    "sparkfold_uninstall",
]


@pytest.mark.slow
def test_ansible_lint_production_profile_is_clean(repo: Path) -> None:
    result = ansible(repo, "ansible-lint", "--profile", "production", "-q", "--nocolor")
    assert result.returncode == 0, result.stdout + result.stderr


PLAYBOOKS = ["site.yml", *(f"playbooks/{s}.yml" for s in [*STAGES, "testbed", "teardown", "uninstall"])]


@pytest.mark.parametrize(
    "inventory",
    ["inventory/example", "inventory/testbed", "inventory/fleet-example", "inventory/fleet-testbed"],
)
def test_syntax_check(repo: Path, inventory: str) -> None:
    # Every playbook in one ansible-playbook run (it loads each in turn and names each it checked):
    # one start of Ansible per inventory instead of one per playbook.
    result = ansible(repo, "ansible-playbook", "-i", inventory, *PLAYBOOKS, "--syntax-check")
    assert result.returncode == 0, result.stdout + result.stderr
    checked = re.findall(r"^playbook: (\S+)$", result.stdout, flags=re.M)
    assert checked == PLAYBOOKS, result.stdout


def test_site_imports_the_stages_in_order_and_each_is_tagged(repo: Path) -> None:
    site = yaml.safe_load((repo / "site.yml").read_text())
    stages = [f"playbooks/stages/{s}.yml" for s in STAGES]
    # The restarts the stages owe come once, after the last stage that can change a rank (service).
    last = STAGES.index("service") + 1
    assert [play["ansible.builtin.import_playbook"] for play in site] == [
        *stages[:last],
        "playbooks/restart.yml",
        *stages[last:],
    ]
    for stage in STAGES:
        [play] = yaml.safe_load((repo / f"playbooks/stages/{stage}.yml").read_text())
        assert play["name"] and stage in play["tags"]
        assert play["roles"] == [{"role": f"sparkfold_{stage}"}]
        alone = yaml.safe_load((repo / f"playbooks/{stage}.yml").read_text())
        assert [p["ansible.builtin.import_playbook"] for p in alone] == [f"stages/{stage}.yml", "restart.yml"]
    [restart] = yaml.safe_load((repo / "playbooks/restart.yml").read_text())
    assert "always" in restart["tags"]


def test_tags_list_every_stage(repo: Path) -> None:
    result = ansible(repo, "ansible-playbook", "-i", "inventory/example", "site.yml", "--list-tags")
    assert result.returncode == 0, result.stderr
    for stage in STAGES:
        assert stage in result.stdout


@pytest.mark.parametrize("role", ROLES)
def test_role_skeleton(repo: Path, role: str) -> None:
    path = repo / "roles" / role
    for part in (
        "defaults/main.yml",
        "meta/main.yml",
        "meta/argument_specs.yml",
        "tasks/main.yml",
        "README.md",
    ):
        assert (path / part).is_file(), f"{role} lacks {part}"
    defaults = yaml.safe_load((path / "defaults/main.yml").read_text()) or {}
    options = yaml.safe_load((path / "meta/argument_specs.yml").read_text())["argument_specs"]["main"][
        "options"
    ]
    assert set(defaults) == set(options), f"{role}: defaults and argument_specs differ"
    assert all(option.get("description") for option in options.values())
    assert all(name.startswith(role) for name in defaults)
    if role.startswith("sparkfold_") and role != "sparkfold_testbed":
        meta = yaml.safe_load((path / "meta/main.yml").read_text())
        assert {"role": "sparkfold"} in meta["dependencies"]


# Knobs a single pair's inventory does not list: group names (hosts.yml uses the defaults), the fleet's
# (inventory/fleet-example), the testbed's (docs/provisioning.md: leave them on a real pair), the
# control host's own, and the CPU engine's torch pin.
_NOT_IN_THE_EXAMPLE = {
    "sparkfold_head_group",
    "sparkfold_worker_group",
    "sparkfold_router_group",
    "sparkfold_pair_name",
    "sparkfold_pair_draining",
    "sparkfold_pair_direct_keys",
    "sparkfold_pair_gateway_allow",
    "sparkfold_router_key",
    "sparkfold_service_firewall_packages",
    "sparkfold_fabric_written_facts",
    "sparkfold_preflight_testbed_arch",
    "sparkfold_image_source",
    "sparkfold_image_context_dir",
    "sparkfold_control_dir",
    "sparkfold_runtime_source_dir",
    "sparkfold_runtime_wheelhouse_dir",
    "sparkfold_preflight_ansible_min",
    "sparkfold_preflight_ansible_max",
    "sparkfold_runtime_lock_dir",
}


def test_the_example_inventory_lists_every_knob_of_a_pair(repo: Path) -> None:
    """Every default of the roles a pair runs is set, or listed commented at its default, in
    inventory/example (docs/install.md: "every knob is there at its default with its meaning")."""
    listed = {
        m.group(1)
        for path in (repo / "inventory/example").rglob("*.yml")
        for line in path.read_text().splitlines()
        if (m := re.match(r"^\s*#?\s*(sparkfold_[a-z0-9_]+):", line))
    }
    knobs = {
        name
        for role in ROLES
        if role not in ("sparkfold_router", "sparkfold_testbed", "sparkfold_uninstall")
        for name in yaml.safe_load((repo / "roles" / role / "defaults/main.yml").read_text()) or {}
    }
    assert not _NOT_IN_THE_EXAMPLE - knobs, "an exception names no knob any more"
    assert sorted(knobs - _NOT_IN_THE_EXAMPLE - listed) == []


def test_every_apt_task_waits_for_the_package_database_minutes_not_apts_60_s(repo: Path) -> None:
    """A freshly booted DGX OS runs apt-daily and unattended-upgrades, which hold apt's lock for
    minutes; the apt module gives up after 60 s by default. Every role installs through
    roles/sparkfold/tasks/apt.yml (the testbed's own host-side tasks aside)."""
    users = [
        path.relative_to(repo)
        for path in (repo / "roles").rglob("*.yml")
        if "ansible.builtin.apt:" in path.read_text() and "sparkfold_testbed" not in path.parts
    ]
    assert users == [Path("roles/sparkfold/tasks/apt.yml")]
    tasks = yaml.safe_load((repo / "roles/sparkfold/tasks/apt.yml").read_text())
    [apt] = [task["ansible.builtin.apt"] for task in tasks if "ansible.builtin.apt" in task]
    assert apt["lock_timeout"] == "{{ sparkfold_apt_lock_timeout_s }}"
    defaults = yaml.safe_load((repo / "roles/sparkfold/defaults/main.yml").read_text())
    assert defaults["sparkfold_apt_lock_timeout_s"] >= 600


def test_restarts_are_owed_to_the_end_and_go_worker_first(repo: Path) -> None:
    handlers = yaml.safe_load((repo / "roles/sparkfold/handlers/main.yml").read_text())
    # A stage's handlers only mark what it changed; no handler restarts an engine or the gateway.
    marks = {h["listen"]: h["ansible.builtin.set_fact"] for h in handlers if "ansible.builtin.set_fact" in h}
    assert marks == {
        "sparkfold engine changed": {"__sparkfold_restart_engine": True},
        "sparkfold api changed": {"__sparkfold_restart_api": True},
    }
    commands = [str(h.get("ansible.builtin.command", "")) for h in handlers]
    assert not [c for c in commands if "sparkfold-engine" in c or "try-restart sparkfold-api" in c]
    restarts = yaml.safe_load((repo / "roles/sparkfold/tasks/restart.yml").read_text())
    names = [task["name"] for task in restarts]
    assert names.index("Engine | restart on the worker") < names.index("Engine | restart on the head")


MANAGEMENT, FABRIC = ipaddress.ip_network("198.51.100.0/24"), ipaddress.ip_network("203.0.113.0/24")
# Commented-out settings count too: an operator uncomments them as they stand.
_HOST_ADDRESS = re.compile(
    r"^\s*#?\s*(ansible_host|sparkfold_fabric_address|sparkfold_fabric_twin_address):\s*(\S+)"
)
_IPV4 = re.compile(r"(?<![\d.])(?:\d{1,3}\.){3}\d{1,3}(?![\d.])")


@pytest.mark.parametrize("inventory", ["inventory/testbed", "inventory/example", "inventory/fleet-example"])
def test_inventories_use_only_the_documentation_ranges(repo: Path, inventory: str) -> None:
    """Management addresses in 198.51.100.0/24, link (and twin) addresses in 203.0.113.0/24, and
    never one in the other's subnet (a twin on the LAN's /24 would take the LAN's route)."""
    found = [
        m.groups()
        for line in (repo / inventory / "hosts.yml").read_text().splitlines()
        if (m := _HOST_ADDRESS.match(line))
    ]
    assert {key for key, _ in found} >= {"ansible_host", "sparkfold_fabric_address"}
    for key, address in found:
        net = MANAGEMENT if key == "ansible_host" else FABRIC
        assert ipaddress.ip_address(address) in net, f"{inventory}: {key} {address} is outside {net}"


def test_documentation_examples_and_tests_use_only_the_documentation_ranges(repo: Path) -> None:
    """Every IPv4 address the docs, inventories, examples, role READMEs and the tests' own fakes
    and inventories show is loopback, the wildcard, a multicast group (ufw's shipped rules in the
    real captures name mDNS's and SSDP's: nobody's host) or in the two RFC 5737 ranges the project
    uses (never TEST-NET-1, the third: see HOUSE rules)."""
    files = [
        repo / "README.md",
        *(path for suffix in ("py", "yml", "toml", "json") for path in (repo / "tests").rglob(f"*.{suffix}")),
        *(repo / "docs").rglob("*.md"),
        *(repo / "inventory").rglob("*.yml"),
        *(repo / "examples").rglob("*.toml"),
        *(repo / "roles").glob("*/README.md"),
        *(repo / "roles").glob("*/defaults/main.yml"),
    ]
    outside = [
        f"{path.relative_to(repo)}: {address}"
        for path in files
        for address in _IPV4.findall(path.read_text())
        if not (ip := ipaddress.ip_address(address)).is_loopback
        and not ip.is_unspecified
        and not ip.is_multicast
        and not any(ip in net for net in (MANAGEMENT, FABRIC))
    ]
    assert not outside, outside


def test_example_inventory_renders_a_valid_pair(repo: Path, example_render: Path) -> None:
    head, worker = (
        load(example_render / "spark-head/sparkfold.toml"),
        load(example_render / "spark-worker/sparkfold.toml"),
    )
    assert (head.node.rank, worker.node.rank) == (0, 1)
    assert (head.fabric.address, head.fabric.peer) == (worker.fabric.peer, worker.fabric.address)
    assert str(head.fabric.address) == "203.0.113.1" and head.engine.kind == "tensorfold"
    assert head.api.cors_allowed_origins == []  # no CORS headers unless origins are named
    assert head.api.model_aliases == ["claude-*", "gpt-*", "codex-*"]  # the coding agents' default names
    assert engine_fingerprint(head) == engine_fingerprint(worker)
    # One folder per pinned commit (weights.yml), as examples/spark-pair/ writes it out.
    assert head.engine.model == load(repo / "examples/spark-pair/head.toml").engine.model
    engine_unit = (example_render / "spark-head/sparkfold-engine.service").read_text()
    assert "Type=notify" in engine_unit and "NotifyAccess=main" in engine_unit
    assert "Restart=on-failure" in engine_unit
    api_unit = (example_render / "spark-head/sparkfold-api.service").read_text()
    assert "ExecReload=/bin/kill -HUP $MAINPID" in api_unit


@pytest.mark.parametrize("host", ["spark-head", "spark-worker"])
def test_the_example_inventory_fits_a_spark_with_the_reserve(
    example_render: Path, tmp_path: Path, host: str
) -> None:
    """The recipe's settings as rendered, their weights as the weights stage writes them down
    (~176 GB checkpoint, ~2 GiB drafter), on a GB10's 121.69 GiB: the memory budget holds."""
    settings = load(example_render / host / "sparkfold.toml")
    for directory, size in (
        (settings.engine.model, 176_000_000_000),
        (settings.engine.tensorfold.drafter, 2 << 30),
    ):
        files = [ManifestFile(path="model.safetensors", sha256="0" * 64, size=size)]
        manifest = default_manifest_path(tmp_path / directory.lstrip("/"))
        manifest.parent.mkdir(parents=True, exist_ok=True)
        manifest.write_text(Manifest.of(files).to_json())
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/meminfo").write_text(f"MemTotal: {int(121.69 * 1024 * 1024)} kB\n")
    plan = budget(settings, tmp_path)
    assert not plan.unknown and plan.reserve_gib == 9.0
    assert plan.fits and plan.headroom_gib > 0.5, plan.sum_text()
    # The engine unit is capped at the budget's limit (121.69 less 9 GiB) and pays first.
    engine_unit = (example_render / host / "sparkfold-engine.service").read_text()
    assert "\nMemoryMax=115394M\n" in engine_unit and "\nOOMScoreAdjust=500\n" in engine_unit
    if host == "spark-head":  # the gateway lives in the reserve and goes last
        api_unit = (example_render / host / "sparkfold-api.service").read_text()
        assert "\nOOMScoreAdjust=-900\nMemoryHigh=2304M\nMemoryMax=3072M\n" in api_unit


@pytest.mark.parametrize(
    ("engine", "api", "lanes", "queued"), [(2, {}, 2, 8), (4, {"sparkfold_api_parallel": 3}, 3, 12)]
)
def test_the_gateway_lanes_follow_the_engine_unless_set_lower(
    repo: Path, tmp_path: Path, engine: int, api: dict[str, int], lanes: int, queued: int
) -> None:
    """An inventory that sets only sparkfold_engine_parallel renders a head that passes config check,
    its gateway with as many lanes and 4 queued a lane (sparkfold.config's rule, written once)."""
    overrides = json.dumps({"sparkfold_engine_parallel": engine, **api})
    render_example(repo, tmp_path, "-e", overrides)
    head = load(tmp_path / "spark-head/sparkfold.toml")
    assert (head.engine.parallel, head.api.parallel, head.api.max_queued) == (engine, lanes, queued)


@pytest.mark.parametrize(
    ("inventory", "extra", "head", "lanes"),
    [
        ("inventory/testbed", (), "sftb-head", 4),
        ("inventory/testbed", ("-e", "@inventory/testbed-tensorfold.yml"), "sftb-head", 4),
        ("inventory/fleet-example", (), "spark-a-head", 1),
    ],
)
def test_the_shipped_inventories_leave_the_gateway_lanes_to_the_engine(
    repo: Path, tmp_path: Path, inventory: str, extra: tuple[str, ...], head: str, lanes: int
) -> None:
    """No inventory repeats what the role derives: the rendered [api] names no lanes, and the
    gateway runs as many as the engine (4 queued a lane)."""
    render_example(repo, tmp_path, *extra, inventory=inventory)
    rendered = (tmp_path / head / "sparkfold.toml").read_text()
    api = rendered[rendered.index("[api]") :].split("\n[", 1)[0]
    assert not re.search(r"^(parallel|max_queued) =", api, re.MULTILINE), api
    settings = load(tmp_path / head / "sparkfold.toml")
    assert (settings.engine.parallel, settings.api.parallel, settings.api.max_queued) == (
        lanes,
        lanes,
        4 * lanes,
    )


def test_cors_allowed_origins_reach_the_gateway_settings(repo: Path, tmp_path: Path) -> None:
    """The role renders api.cors_allowed_origins (the example leaves it empty: no CORS headers)."""
    origins = ["https://app.example", "http://127.0.0.1:5173"]
    render_example(repo, tmp_path, "-e", json.dumps({"sparkfold_api_cors_allowed_origins": origins}))
    assert load(tmp_path / "spark-head/sparkfold.toml").api.cors_allowed_origins == origins


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
def test_rendered_units_pass_systemd_analyze_verify(example_render: Path) -> None:
    for unit in ("sparkfold-engine.service", "sparkfold-api.service"):
        check = subprocess.run(
            ["systemd-analyze", "verify", "--man=no", str(example_render / "spark-head" / unit)],
            capture_output=True,
            text=True,
            check=False,
        )
        # Missing binaries on this host are expected (the venv is on the node); syntax errors are not.
        problems = [
            line
            for line in check.stderr.splitlines()
            if line and "is not executable" not in line and "No such file" not in line
        ]
        assert not problems, check.stderr


def exposure(unit: Path) -> float:
    """``systemd-analyze security --offline`` overall exposure of a unit file (0 safe .. 10 exposed)."""
    check = subprocess.run(
        ["systemd-analyze", "security", "--offline=true", "--no-pager", str(unit)],
        capture_output=True,
        text=True,
        check=False,
    )
    found = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", check.stdout)
    assert found, check.stdout + check.stderr
    return float(found.group(1))


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
def test_units_keep_their_hardening(example_render: Path) -> None:
    units = {
        name: example_render / "spark-head" / f"{name}.service"
        for name in ("sparkfold-api", "sparkfold-engine")
    }
    # The production (tensorfold) engine unit: no capabilities, private mounts, private files.
    engine = units["sparkfold-engine"].read_text().splitlines()
    for directive in (
        "NoNewPrivileges=true",
        "CapabilityBoundingSet=",
        "AmbientCapabilities=",
        "PrivateMounts=true",
    ):
        assert directive in engine, directive
    assert "UMask=0077" in engine and "ProtectSystem=strict" in engine
    if (
        "--offline"
        not in subprocess.run(["systemd-analyze", "--help"], capture_output=True, text=True).stdout
    ):
        pytest.skip("this systemd-analyze cannot score unit files offline (systemd < 250)")
    # STYLE.md: the api unit's exposure stays at 3.0 or lower; the engine's is held where it is now.
    assert exposure(units["sparkfold-api"]) <= 3.0
    assert exposure(units["sparkfold-engine"]) <= 3.0


def test_units_raise_the_descriptor_limit(example_render: Path) -> None:
    # 1,100 idle connections used to exhaust the default 1,024 descriptors (issue 15)
    for name in ("sparkfold-api", "sparkfold-engine"):
        assert "LimitNOFILE=65536" in (example_render / "spark-head" / f"{name}.service").read_text(), name
