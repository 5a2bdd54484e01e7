"""The sparkfold_weights role's Hub source on this host (the head, local connection) against the fake
Hub on loopback: fetch the pinned model and a gated drafter, never show the token, converge, plan in
check mode, repair a lost file, stop in words on a pin the Hub does not have, and hold the drafter
to its sha256 pins (the inventory's, else those recorded at the first run).

The head -> worker copy of the same stores is the testbed's (tests/testbed): it is the same tasks
whatever the source.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fakes"))
from fake_hub import FakeHub, FakeRepo
from local_head import ansible, fake_tools, write_inventory

MODEL, DRAFTER = "acme/glm-tiny", "acme/glm-tiny-drafter"
MODEL_COMMIT = "0123456789abcdef0123456789abcdef01234567"
DRAFTER_COMMIT = "89abcdef0123456789abcdef0123456789abcdef"
TOKEN = "hf_role_SECRET_token_1234"
rng = random.Random(5)
MODEL_FILES = {
    "config.json": b'{"model_type": "glm"}\n',
    "model-00001-of-00002.safetensors": rng.randbytes(200_000),
    "model-00002-of-00002.safetensors": rng.randbytes(100_000),
}
DRAFTER_FILES = {"config.json": b"{}\n", "model.safetensors": rng.randbytes(50_000)}


@pytest.fixture
def hub() -> Iterator[FakeHub]:
    repos = (
        FakeRepo(MODEL, MODEL_FILES, commit=MODEL_COMMIT),
        FakeRepo(DRAFTER, DRAFTER_FILES, commit=DRAFTER_COMMIT, token=TOKEN),  # gated
    )
    with FakeHub(*repos) as running:
        yield running


@pytest.fixture
def head(tmp_path: Path, repo: Path, hub: FakeHub) -> Path:
    """A one-node inventory (the head, local connection, tp 1) with its own folders, and a
    ``sparkfold`` in its install dir that runs this checkout's package."""
    venv_bin = tmp_path / "install/venv/bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "sparkfold").write_text(
        f"#!/bin/sh\nPYTHONPATH={repo / 'runtime'} exec {sys.executable} "
        "-c 'from sparkfold.cli import main; main()' \"$@\"\n"
    )
    (venv_bin / "sparkfold").chmod(0o755)
    write_inventory(
        tmp_path,
        sparkfold_install_dir=str(tmp_path / "install"),
        sparkfold_state_dir=str(tmp_path / "state"),
        sparkfold_config_dir=str(tmp_path / "etc"),
        sparkfold_model_name=f"{MODEL}/{MODEL_COMMIT}",
        sparkfold_weights_source="hub",
        sparkfold_weights_hub_repo=MODEL,
        sparkfold_weights_hub_revision=MODEL_COMMIT,
        sparkfold_weights_hub_drafter_repo=DRAFTER,
        sparkfold_weights_hub_drafter_revision=DRAFTER_COMMIT,
        sparkfold_weights_hub_endpoint=hub.url,
        sparkfold_weights_hub_token="{{ vault_sparkfold_hf_token }}",
        sparkfold_weights_hub_poll_s=1,
        sparkfold_weights_reserve_gib=0,
    )
    (tmp_path / "vault.yml").write_text(yaml.safe_dump({"vault_sparkfold_hf_token": TOKEN}))
    (tmp_path / "calls").mkdir()
    return tmp_path


def play(repo: Path, head: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **fake_tools(repo, head / "calls"),  # the fake systemctl records the restart there
        "HF_HOME": str(head / "hf-home"),
        "HF_HUB_OFFLINE": None,
        "HF_TOKEN": None,
    }
    hosts, vault = str(head / "hosts.yml"), f"@{head / 'vault.yml'}"
    return ansible(
        repo, "ansible-playbook", "-i", hosts, "-e", vault, "playbooks/weights.yml", *args, env=env
    )


def recap(result: subprocess.CompletedProcess[str]) -> dict[str, int]:
    line = next(line for line in result.stdout.splitlines() if line.startswith("h1 ") and "ok=" in line)
    return {key: int(value) for key, value in re.findall(r"(\w+)=(\d+)", line)}


def store(head: Path, repo_id: str, commit: str) -> Path:
    return head / "state/models" / repo_id / commit


@pytest.mark.slow
def test_hub_source_fetches_both_pins_converges_and_never_shows_the_token(
    repo: Path, head: Path, hub: FakeHub
) -> None:
    first = play(repo, head)
    assert first.returncode == 0, first.stdout + first.stderr
    for repo_id, commit, files in (
        (MODEL, MODEL_COMMIT, MODEL_FILES),
        (DRAFTER, DRAFTER_COMMIT, DRAFTER_FILES),
    ):
        folder = store(head, repo_id, commit)
        assert {p: (folder / p).read_bytes() for p in files} == files
        assert Path(f"{folder}.manifest.json").is_file()
        assert "download:" in Path(f"{folder}.fetch.log").read_text()  # progress, kept for the operator
    assert f"model {MODEL}@{MODEL_COMMIT}: downloaded 3 of 3 files" in " ".join(first.stdout.split())
    assert "try-restart sparkfold-engine.service" in (head / "calls/calls").read_text()
    token_file = head / "etc/hf-token"
    assert token_file.read_text().strip() == TOKEN and stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert TOKEN not in first.stdout + first.stderr
    assert any(auth == f"Bearer {TOKEN}" for *_, auth in hub.requests)  # the gated drafter needed it

    asked = len(hub.requests)
    again = play(repo, head)
    assert again.returncode == 0 and recap(again)["changed"] == 0, again.stdout
    assert len(hub.requests) == asked, "a complete store is not fetched again (the Hub is not asked)"
    assert TOKEN not in again.stdout + again.stderr


@pytest.mark.slow
def test_check_mode_plans_a_missing_file_and_a_run_repairs_it(repo: Path, head: Path) -> None:
    assert play(repo, head).returncode == 0
    lost = store(head, MODEL, MODEL_COMMIT) / "model-00002-of-00002.safetensors"
    lost.unlink()

    check = play(repo, head, "--check")
    assert check.returncode == 0, check.stdout + check.stderr
    assert recap(check)["changed"] > 0
    assert not lost.exists(), "a check run downloads nothing"

    repair = play(repo, head)
    assert repair.returncode == 0, repair.stdout + repair.stderr
    assert lost.read_bytes() == MODEL_FILES["model-00002-of-00002.safetensors"]
    assert "downloaded 1 of 3 files" in " ".join(repair.stdout.split())


@pytest.mark.slow
def test_a_pin_the_hub_does_not_have_stops_in_words(repo: Path, head: Path) -> None:
    wrong = "f" * 40
    failed = play(repo, head, "-e", f"sparkfold_weights_hub_revision={wrong}")
    assert failed.returncode != 0
    assert f"fetching {MODEL}@{wrong}" in failed.stdout
    assert "check the pinned commit" in failed.stdout


def test_the_heads_copy_key_gets_its_folder_where_root_has_no_ssh_folder(repo: Path, tmp_path: Path) -> None:
    """A node's root need not have ~/.ssh (the testbed's systemd 252 makes one at boot; a Spark whose
    root never logged in may have none), and openssh_keypair does not make its folder."""
    home = tmp_path / "root-home"
    home.mkdir()
    hosts = write_inventory(
        tmp_path,
        sparkfold_state_dir=str(tmp_path / "state"),
        sparkfold_weights_ssh_key=str(home / ".ssh/sparkfold_weights"),
    )
    role = ["-e", "role=sparkfold_weights", "-e", "tasks_file=worker.yml"]
    result = ansible(repo, "ansible-playbook", "-i", str(hosts), "tests/ansible/role_tasks.yml", *role)
    assert result.returncode == 0, result.stdout + result.stderr
    assert stat.S_IMODE((home / ".ssh").stat().st_mode) == 0o700
    assert (home / ".ssh/sparkfold_weights").is_file() and (home / ".ssh/sparkfold_weights.pub").is_file()


def drafter_record(head: Path) -> Path:
    return head / "control/pins" / head.name / f"drafter-{DRAFTER.replace('/', '_')}-{DRAFTER_COMMIT}.yml"


DRAFTER_SHA256 = {path: hashlib.sha256(data).hexdigest() for path, data in DRAFTER_FILES.items()}


@pytest.mark.slow
def test_the_drafters_digests_are_recorded_at_the_first_run_and_other_bytes_are_refused(
    repo: Path, head: Path, hub: FakeHub
) -> None:
    """Peers got other bytes from the same drafter repository: the first run records every file's
    sha256 on the control host (trust on first use), a later fetch of other bytes stops the stage
    naming the file, the recorded and the found digest, and nothing is served from it."""
    first = play(repo, head)
    assert first.returncode == 0, first.stdout + first.stderr
    assert yaml.safe_load(drafter_record(head).read_text()) == DRAFTER_SHA256
    words = " ".join(first.stdout.split())
    assert "WARNING: sparkfold_weights_hub_drafter_files does not pin every file by sha256" in words
    assert f"copy them into the inventory ({head}/group_vars/all/weights.yml)" in words

    again = play(repo, head)
    assert again.returncode == 0 and recap(again)["changed"] == 0, again.stdout
    assert "WARNING: sparkfold_weights_hub_drafter_files" not in again.stdout

    other = random.Random(9).randbytes(50_000)
    hub.repos[DRAFTER].files = {**DRAFTER_FILES, "model.safetensors": other}  # the same commit, other bytes
    restarts = (head / "calls/calls").read_text().count("try-restart")
    subprocess.run(["rm", "-rf", str(store(head, DRAFTER, DRAFTER_COMMIT))], check=True)  # a fresh head
    Path(f"{store(head, DRAFTER, DRAFTER_COMMIT)}.manifest.json").unlink()
    refused = play(repo, head)
    assert refused.returncode != 0
    said = " ".join(refused.stdout.split())
    found, pinned = hashlib.sha256(other).hexdigest(), DRAFTER_SHA256["model.safetensors"]
    assert f"model.safetensors has sha256 {found}, not the pinned {pinned}" in said
    assert f"sha256 pins: sparkfold_weights_hub_drafter_files in {head}/group_vars/all/weights.yml" in said
    assert not Path(f"{store(head, DRAFTER, DRAFTER_COMMIT)}.manifest.json").exists()
    assert (head / "calls/calls").read_text().count("try-restart") == restarts, "no restart onto it"


@pytest.mark.slow
def test_the_inventorys_drafter_pins_override_the_record(repo: Path, head: Path) -> None:
    drafter_record(head).parent.mkdir(parents=True)
    drafter_record(head).write_text(yaml.safe_dump({path: "0" * 64 for path in DRAFTER_FILES}))
    pinned = play(repo, head, "-e", json.dumps({"sparkfold_weights_hub_drafter_files": DRAFTER_SHA256}))
    assert pinned.returncode == 0, pinned.stdout + pinned.stderr
    assert "WARNING: sparkfold_weights_hub_drafter_files" not in pinned.stdout  # every file is pinned

    wrong = {**DRAFTER_SHA256, "config.json": "1" * 64}
    refused = play(repo, head, "-e", json.dumps({"sparkfold_weights_hub_drafter_files": wrong}))
    assert refused.returncode != 0
    said = " ".join(refused.stdout.split())
    assert f"config.json has sha256 {DRAFTER_SHA256['config.json']}, not the pinned {'1' * 64}" in said
