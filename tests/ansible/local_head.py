"""A one-node inventory for role tests on this host: the head ``h1`` over a local connection, tp 1,
the tensorfold engine, its own control-host folder."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml


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
