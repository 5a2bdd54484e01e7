"""The testbed is as strict as DGX OS where it matters (docs/provisioning.md, "Testbed").

The nodes are reached as an unprivileged admin login with passwordless sudo; sshd refuses root;
the node image lacks what the roles need, which the roles install with apt from the only package
source the nodes have (the control host's folder on the management bridge); Docker runs inside.
"""

from __future__ import annotations

import subprocess

import pytest
from testbed_kit import ADMIN, HEAD, REPO, WORKER, Run, ssh, ssh_argv

# One testbed per session: the first test also waits for the first converge (minutes on a busy host).
pytestmark = [pytest.mark.testbed, pytest.mark.slow, pytest.mark.netns, pytest.mark.timeout(1800)]
PREREQUISITES = ("python3-venv", "rsync", "iproute2", "iputils-ping")


def test_sshd_refuses_root(testbed: None) -> None:
    done = subprocess.run(
        [*ssh_argv(HEAD, "root"), "true"], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 255 and "Permission denied" in done.stderr, done


def test_the_admin_login_is_unprivileged_with_passwordless_sudo(testbed: None) -> None:
    for node in (HEAD, WORKER):
        plain = subprocess.run(
            [*ssh_argv(node), "id -un; id -u"], capture_output=True, text=True, timeout=60, check=True
        )
        assert plain.stdout.split() == [ADMIN, "1000"]
        assert ssh(node, "id -u") == "0"


def test_the_node_image_lacks_what_the_roles_install(testbed: None) -> None:
    images = sorted((REPO / ".cache/testbed").glob("rootfs-*/"))
    assert images
    for image in images:
        listed = subprocess.run(
            [
                "chroot",
                str(image),
                "dpkg-query",
                "-W",
                "-f",
                "${Package} ${db:Status-Status}\n",
                *PREREQUISITES,
            ],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
        assert " installed" not in listed, f"{image.name} already holds: {listed}"


def test_the_roles_installed_the_prerequisites_from_the_testbed_source(first_converge: Run) -> None:
    first_converge.must_succeed()
    for node in (HEAD, WORKER):
        statuses = ssh(node, f"dpkg-query -W -f '${{db:Status-Status}}\\n' {' '.join(PREREQUISITES)}")
        assert statuses.split() == ["installed"] * len(PREREQUISITES)
        sources = ssh(node, "grep -rhs '^deb' /etc/apt/sources.list /etc/apt/sources.list.d/ || true")
        assert sources.splitlines() == ["deb [trusted=yes] http://198.51.100.1:8090/ ./"]
        assert ssh(node, "ip -4 route show default") == "", "a node must have no way out"


def test_docker_answers_in_the_nodes(testbed: None) -> None:
    for node in (HEAD, WORKER):
        assert ssh(node, "docker version --format '{{.Server.Version}}'").startswith("20.10.")
        assert ssh(node, "docker info --format '{{.Driver}}'") == "overlay2"
