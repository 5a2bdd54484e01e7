"""Role tests on this host: a one-node inventory (the head ``h1`` over a local connection, tp 1, the
tensorfold engine, its own control-host folder), the venv's ansible tools run from the repo, and
what the example inventory renders (``render.yml``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

BIN = Path(sys.executable).parent


def ansible(
    repo: Path, tool: str, *args: str, env: Mapping[str, str | None] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``tool`` (``ansible-playbook`` …) of this venv in ``repo`` with its ansible.cfg, without colour.

    ``env`` adds to this process's environment; a ``None`` value removes that variable.
    """
    environ = {
        **os.environ,
        "ANSIBLE_CONFIG": str(repo / "ansible.cfg"),
        "ANSIBLE_NOCOLOR": "1",
        **(env or {}),
    }
    return subprocess.run(
        [str(BIN / tool), *args],
        cwd=repo,
        env={key: value for key, value in environ.items() if value is not None},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def fake_tools(repo: Path, calls: Path) -> dict[str, str]:
    """Environment that puts the fake ``docker`` and ``systemctl`` first on PATH, recording into ``calls``."""
    return {
        "PATH": f"{repo / 'tests/ansible/fakes'}:{BIN}:{os.environ['PATH']}",
        "FAKE_DOCKER_DIR": str(calls),
    }


def write_inventory(folder: Path, **group_vars: Any) -> Path:
    """``folder/hosts.yml`` with ``group_vars`` on top of the common ones; returns its path."""
    inventory = {
        "sparkfold_nodes": {
            "children": {
                "sparkfold_head": {
                    "hosts": {
                        "h1": {
                            "ansible_connection": "local",
                            "ansible_python_interpreter": sys.executable,
                            "sparkfold_fabric_address": "203.0.113.1",
                        }
                    }
                },
                "sparkfold_worker": {"hosts": {}},
            },
            "vars": {
                "sparkfold_engine": "tensorfold",
                "sparkfold_engine_tp": 1,
                "sparkfold_control_dir": str(folder / "control"),
                **group_vars,
            },
        }
    }
    hosts = folder / "hosts.yml"
    hosts.write_text(yaml.safe_dump(inventory))
    return hosts


def host_systemd() -> str:
    """This host's ``systemctl --version`` line (units render per systemd version); '' without one."""
    if shutil.which("systemctl") is None:
        return ""
    version = subprocess.run(["systemctl", "--version"], capture_output=True, text=True).stdout
    return version.partition("\n")[0]


def render_example(repo: Path, folder: Path, *extra: str, inventory: str = "inventory/example") -> Path:
    """What an inventory (the example unless named) renders (sparkfold.toml, the units, netplan) for
    this host's systemd, per host under ``folder``; ``extra``: more ansible-playbook arguments."""
    args = ["-i", inventory, "tests/ansible/render.yml", "-e", f"render_dir={folder}", *extra]
    if host_systemd():
        args += ["-e", f"render_systemd='{host_systemd()}'"]
    result = ansible(repo, "ansible-playbook", *args)
    assert result.returncode == 0, result.stdout + result.stderr
    return folder


def install_sparkfold(repo: Path, folder: Path) -> Path:
    """``<folder>/venv/bin/sparkfold`` running this checkout's runtime, as the node's venv would."""
    script = folder / "venv/bin/sparkfold"
    script.parent.mkdir(parents=True)
    script.write_text(
        f"#!/bin/sh\nPYTHONPATH={repo / 'runtime'} exec {sys.executable} -c "
        "'from sparkfold.cli import main; main()' \"$@\"\n"
    )
    script.chmod(0o755)
    return folder
