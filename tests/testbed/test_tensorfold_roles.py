"""The image and weights stages on the testbed with ``sparkfold_engine: tensorfold`` selected.

The nodes have no Hub: a check run of the weights stage passes without a Hub task. The fake Hub,
served on the control host's testbed bridge address, proves the Hub source end to end: the head
fetches, the worker gets the files over the fabric link and the head's manifest, and the drafter is
held to the sha256 recorded at its first fetch. Then a fake ``docker`` (images are files holding their
series label; ``save``/``load`` move them) on both nodes proves the head -> worker image copy over the
fabric link: the worker gets the head's image, a re-run copies nothing, and a worker image with another
label is replaced. Runs after test_pair.py, on the same converged pair.
"""

from __future__ import annotations

import hashlib
import json
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from testbed_kit import ADMIN, HEAD, REPO, WORKER, Run, play, ssh, wait_for

sys.path.insert(0, str(REPO / "tests/fakes"))
from fake_hub import FakeHub, FakeRepo

# One testbed per session: the first test also waits for the first converge (minutes on a busy host).
pytestmark = [pytest.mark.testbed, pytest.mark.slow, pytest.mark.netns, pytest.mark.timeout(1800)]
COMMIT = "0123456789abcdef0123456789abcdef01234567"
IMAGE_FILE = "/var/lib/fake-docker/image-sparkfold-tensorfold_v0.6.0"
TENSORFOLD: dict[str, Any] = {"sparkfold_engine": "tensorfold"}
CDN = "sftb-cdn.test"  # RFC 2606 name, in the head's /etc/hosts for the Hub test only


def test_check_mode_of_the_weights_stage_runs_no_hub_task(first_converge: Run, artifacts: Path) -> None:
    first_converge.must_succeed()
    weights = play(artifacts / "tf-check-weights", "playbooks/weights.yml", extravars=TENSORFOLD, check=True)
    weights.must_change_nothing()
    assert "no Hugging Face Hub task runs" in " ".join(weights.output.split())


def engines_active() -> None:
    """A weights or image change restarts the engines: leave the pair running for what comes next."""
    wait_for(
        "both engine units active again",
        lambda: (
            ssh(HEAD, "systemctl is-active sparkfold-engine", check=False) == "active"
            and ssh(WORKER, "systemctl is-active sparkfold-engine", check=False) == "active"
        ),
        timeout_s=600,
        every_s=3,
    )


def test_hub_weights_reach_the_worker_over_the_fabric(first_converge: Run, artifacts: Path) -> None:
    """The model and the drafter reach both nodes; the first run records the drafter's sha256 on the
    control host, and a later fetch of other bytes from the same drafter commit is refused."""
    first_converge.must_succeed()
    repo_id, commit = "acme/tiny-glm", "fedcba9876543210fedcba9876543210fedcba98"
    drafter_id, drafter_commit = "acme/tiny-glm-drafter", "89abcdef0123456789abcdef0123456789abcdef"
    rng = random.Random(3)
    files = {"config.json": b"{}\n", "model.safetensors": rng.randbytes(150_000)}
    drafter_files = {"config.json": b'{"drafter": 1}\n', "model.safetensors": rng.randbytes(40_000)}
    store = f"/var/lib/sparkfold/models/{repo_id}/{commit}"
    drafter_store = f"/var/lib/sparkfold/models/{drafter_id}/{drafter_commit}"
    record = REPO / f".cache/control/pins/testbed/drafter-{drafter_id.replace('/', '_')}-{drafter_commit}.yml"
    # The control host's address on the testbed bridge: the nodes reach it over their management link.
    # The CDN is the same server under another name (huggingface_hub follows redirects on one host).
    ssh(HEAD, f"echo '198.51.100.1 {CDN}' >> /etc/hosts")
    repos = (
        FakeRepo(repo_id, files, commit=commit),
        FakeRepo(drafter_id, drafter_files, commit=drafter_commit),
    )
    with FakeHub(*repos, host="198.51.100.1", cdn_host=CDN) as hub:
        extravars = {
            **TENSORFOLD,
            "sparkfold_weights_source": "hub",
            "sparkfold_weights_hub_repo": repo_id,
            "sparkfold_weights_hub_revision": commit,
            "sparkfold_weights_hub_drafter_repo": drafter_id,
            "sparkfold_weights_hub_drafter_revision": drafter_commit,
            "sparkfold_weights_hub_endpoint": hub.url,
            "sparkfold_weights_hub_poll_s": 1,
            "sparkfold_model_name": f"{repo_id}/{commit}",
        }
        try:
            record.unlink(missing_ok=True)
            fetched = play(artifacts / "tf-hub", "playbooks/weights.yml", extravars=extravars).must_succeed()
            assert fetched.changed.get("sftb-worker", 0) > 0
            for folder, held in ((store, files), (drafter_store, drafter_files)):
                expected = {path: hashlib.sha256(data).hexdigest() for path, data in held.items()}
                for node in (HEAD, WORKER):
                    sums = ssh(node, f"cd {folder} && sha256sum {' '.join(sorted(held))}").splitlines()
                    assert {line.split()[1]: line.split()[0] for line in sums} == expected
                assert ssh(WORKER, f"cat {folder}.manifest.json") == ssh(HEAD, f"cat {folder}.manifest.json")
            drafter_sha256 = {path: hashlib.sha256(data).hexdigest() for path, data in drafter_files.items()}
            assert yaml.safe_load(record.read_text()) == drafter_sha256  # trust on first use
            assert "WARNING: sparkfold_weights_hub_drafter_files" in " ".join(fetched.output.split())
            assert (
                ssh(WORKER, f"test -e {store}/.cache/huggingface || echo none") == "none"
            )  # the head's bookkeeping
            asked = len(hub.requests)
            again = play(artifacts / "tf-hub-again", "playbooks/weights.yml", extravars=extravars)
            again.must_change_nothing()
            assert len(hub.requests) == asked

            # The same drafter commit with other bytes, on a head that has to fetch it again.
            other = random.Random(4).randbytes(40_000)
            hub.repos[drafter_id].files = {**drafter_files, "model.safetensors": other}
            ssh(HEAD, f"rm -rf {drafter_store} {drafter_store}.manifest.json")
            refused = play(artifacts / "tf-hub-other-drafter", "playbooks/weights.yml", extravars=extravars)
            assert refused.rc != 0
            said = " ".join(refused.output.split())
            found, pinned = hashlib.sha256(other).hexdigest(), drafter_sha256["model.safetensors"]
            assert f"model.safetensors has sha256 {found}, not the pinned {pinned}" in said
            assert ssh(HEAD, f"test -e {drafter_store}.manifest.json || echo none") == "none"
        finally:
            for node in (HEAD, WORKER):
                ssh(node, f"rm -rf /var/lib/sparkfold/models/{repo_id.split('/')[0]}", check=False)
            ssh(HEAD, f"sed -i '/ {CDN}$/d' /etc/hosts", check=False)
            record.unlink(missing_ok=True)
            engines_active()


def pinned_base() -> str:
    """The role's default base image pinned by the digest the fake docker's registry gives its tag
    (the sha256 of the tag), as an inventory that copied in the digest recorded at first use would."""
    defaults = yaml.safe_load((REPO / "roles/sparkfold_image/defaults/main.yml").read_text())
    tag = defaults["sparkfold_image_base"].split("@")[0]
    return f"{tag}@sha256:{hashlib.sha256(tag.encode()).hexdigest()}"


def series_hash() -> str:
    """What the image role computes for the defaults, the pinned base and COMMIT (sparkfold image hash)."""
    defaults = yaml.safe_load((REPO / "roles/sparkfold_image/defaults/main.yml").read_text())
    argv = [sys.executable, "-c", "from sparkfold.cli import main; main()", "image", "hash", "--json"]
    argv += ["--series", str(REPO / "patches/tensorfold/v0.6.0/series")]
    argv += ["--base", pinned_base(), "--ref", f"v0.6.0@{COMMIT}"]
    argv += [f"--extra={extra}" for extra in defaults["sparkfold_image_extras"]]
    done = subprocess.run(
        argv, capture_output=True, text=True, check=True, env={"PYTHONPATH": str(REPO / "runtime")}
    )
    return str(json.loads(done.stdout)["hash"])


@pytest.fixture
def fake_docker(first_converge: Run) -> Iterator[None]:
    first_converge.must_succeed()
    fake = (REPO / "tests/ansible/fakes/docker").read_text()
    for node in (HEAD, WORKER):
        ssh(node, "cat > /usr/local/bin/docker && chmod 755 /usr/local/bin/docker", stdin=fake)
    try:
        yield
    finally:
        for node in (HEAD, WORKER):
            ssh(node, "rm -rf /usr/local/bin/docker /var/lib/fake-docker", check=False)
        engines_active()


def loads(node: str) -> int:
    calls = ssh(node, "cat /var/lib/fake-docker/calls", check=False)
    return sum(line == "load" for line in calls.splitlines())


def test_worker_receives_the_head_image_over_the_fabric_once(fake_docker: None, artifacts: Path) -> None:
    label = series_hash()
    ssh(HEAD, f"mkdir -p /var/lib/fake-docker && echo {label} > {IMAGE_FILE}")
    extravars = {
        **TENSORFOLD,
        "sparkfold_image_tensorfold_commit": COMMIT,
        "sparkfold_image_base": pinned_base(),
        "sparkfold_image_docker_required": True,
        # The testbed's package source has no git, and this image is current (nothing is fetched):
        # the head's Git tools are installed by hand here (tools.yml: tests/ansible/test_image_role.py).
        "sparkfold_image_head_packages": [],
    }

    copy = play(artifacts / "tf-image-copy", "playbooks/image.yml", extravars=extravars).must_succeed()
    assert copy.changed.get("sftb-worker", 0) > 0
    assert "build" not in ssh(HEAD, "cut -d' ' -f1 /var/lib/fake-docker/calls").split(), (
        "the head's image was current"
    )
    assert ssh(WORKER, f"cat {IMAGE_FILE}") == label
    assert loads(WORKER) == 1
    # Over the link: the worker accepts the head's key from the head's fabric address only.
    keys = ssh(WORKER, f"grep 'command=\"sudo -n docker load\"' /home/{ADMIN}/.ssh/authorized_keys")
    assert keys.startswith('restrict,from="203.0.113.1",command="sudo -n docker load" ssh-ed25519 ')

    play(artifacts / "tf-image-again", "playbooks/image.yml", extravars=extravars).must_change_nothing()
    assert loads(WORKER) == 1

    ssh(WORKER, f"echo {'0' * 64} > {IMAGE_FILE}")  # another series on the worker
    play(artifacts / "tf-image-differs", "playbooks/image.yml", extravars=extravars).must_succeed()
    assert ssh(WORKER, f"cat {IMAGE_FILE}") == label
    assert loads(WORKER) == 2
