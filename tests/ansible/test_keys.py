"""API keys on a local head: at -vvv no key is ever printed, the head holds only ``sha256:`` digests,
and a second control host reuses the pair's key (a shared ``sparkfold_credentials_dir``) or stops,
never rotating it behind the clients' back."""

from __future__ import annotations

import hashlib
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from local_head import ansible, fake_tools, write_inventory

from sparkfold.api.keys import KeyStore


@pytest.fixture
def head(tmp_path: Path) -> Path:
    (tmp_path / "etc").mkdir()
    (tmp_path / "calls").mkdir()
    return tmp_path


def run(repo: Path, head: Path, *extra: str, **group_vars: object) -> subprocess.CompletedProcess[str]:
    hosts = write_inventory(head, sparkfold_config_dir=str(head / "etc"), sparkfold_user="root", **group_vars)
    env = fake_tools(repo, head / "calls")  # the reload handler's systemctl is a recorder
    return ansible(
        repo, "ansible-playbook", "-vvv", "-i", str(hosts), "tests/ansible/keys.yml", *extra, env=env
    )


def recap(result: subprocess.CompletedProcess[str]) -> dict[str, int]:
    line = next(line for line in result.stdout.splitlines() if line.startswith("h1 ") and "ok=" in line)
    return {key: int(value) for key, value in re.findall(r"(\w+)=(\d+)", line)}


def digest(key: str) -> str:
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


@pytest.mark.slow
def test_a_generated_key_never_shows_and_the_head_holds_its_digest(repo: Path, head: Path) -> None:
    first = run(repo, head)
    assert first.returncode == 0, first.stdout + first.stderr
    key_file = head / "control/credentials" / head.name / "api-key"
    key = key_file.read_text().strip()
    assert key.startswith("sk-sf-") and oct(key_file.stat().st_mode & 0o777) == "0o600"
    assert (head / "etc/api-keys").read_text() == digest(key) + "\n"
    assert KeyStore(head / "etc/api-keys").accepts(key)  # the gateway accepts the key by its digest
    again = run(repo, head)
    assert again.returncode == 0 and recap(again)["changed"] == 0, again.stdout
    for result in (first, again):
        assert key not in result.stdout + result.stderr


def test_vault_keys_never_show_and_a_given_digest_is_kept(repo: Path, head: Path) -> None:
    plain, other = "sk-vault-SECRET-0123456789", "sk-vault-OTHER-9876543210"
    result = run(repo, head, sparkfold_api_keys=[plain, digest(other)])
    assert result.returncode == 0, result.stdout + result.stderr
    assert plain not in result.stdout + result.stderr
    assert (head / "etc/api-keys").read_text().split() == [digest(plain), digest(other)]
    assert not (head / "control/credentials").exists()  # nothing generated


@pytest.mark.slow
def test_a_second_control_host_reuses_the_key_or_stops(repo: Path, head: Path) -> None:
    assert run(repo, head).returncode == 0
    installed = (head / "etc/api-keys").read_text()
    shared = head / "control/credentials" / head.name
    # Another checkout: its own control folder, which has never seen this pair's key.
    elsewhere = {"sparkfold_control_dir": str(head / "laptop")}
    refused = run(repo, head, **elsewhere)
    assert refused.returncode != 0
    assert "would lock the clients out" in refused.stdout and "sparkfold_credentials_dir" in refused.stdout
    assert (head / "etc/api-keys").read_text() == installed and not (head / "laptop/credentials").exists()
    # Pointed at the folder the control hosts share, it reuses the key: nothing changes.
    reused = run(repo, head, **elsewhere, sparkfold_credentials_dir=str(shared))
    assert reused.returncode == 0 and recap(reused)["changed"] == 0, reused.stdout
    assert (head / "etc/api-keys").read_text() == installed


# Names that hold a secret's value (not its file's path): a task whose arguments use one must be
# no_log. (Roles never name vault_* variables: the inventory maps them onto these.)
SECRETS = re.compile(
    r"\b(sparkfold_api_keys|__sparkfold_verify_key|sparkfold_weights_hub_token)\b"
    r"|lookup\('ansible\.builtin\.file', (sparkfold_service_api_key_file|_sparkfold_verify_key_file)"
)
NOT_THE_VALUE = re.compile(r"\b[\w.]+ \| length\b")  # `keys | length > 0` tells nothing about a key
CONTROL = {"name", "when", "no_log", "tags", "register", "changed_when", "failed_when", "notify", "listen"}


def tasks(items: list[dict[str, object]]) -> list[dict[str, object]]:
    found = []
    for item in items or []:
        found.append(item)
        for section in ("block", "rescue", "always"):
            found += tasks(item.get(section) or [])  # type: ignore[arg-type]
    return found


def test_every_task_a_secret_passes_through_is_no_log(repo: Path) -> None:
    leaks = []
    for path in sorted((repo / "roles").glob("*/*/*.yml")):
        if path.parent.name not in ("tasks", "handlers"):
            continue
        for task in tasks(yaml.safe_load(path.read_text()) or []):
            if any(section in task for section in ("block", "rescue", "always")):
                continue
            text = NOT_THE_VALUE.sub("", repr({k: v for k, v in task.items() if k not in CONTROL}))
            if SECRETS.search(text) and task.get("no_log") is not True:
                leaks.append(f"{path.relative_to(repo)}: {task.get('name')}")
    assert not leaks, f"a secret passes through these tasks without no_log: {leaks}"
