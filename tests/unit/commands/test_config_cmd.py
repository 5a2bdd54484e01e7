"""``sparkfold config check|fingerprint`` through click's runner."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner, Result

from sparkfold.cli import main


def check(folder: Path, text: str, *options: str, name: str = "head.toml") -> Result:
    """``sparkfold config check [options] FILE`` on ``text`` written to ``folder/name``."""
    config = folder / name
    config.write_text(text)
    return CliRunner().invoke(main, ["config", "check", *options, str(config)])


def test_check_ok(repo: Path) -> None:
    result = CliRunner().invoke(main, ["config", "check", str(repo / "examples/local.toml")])
    assert result.exit_code == 0, result.output
    assert "ok (rank 0 of 1, engine transformers)" in result.output


def test_check_json(repo: Path) -> None:
    result = CliRunner().invoke(main, ["config", "check", "--json", str(repo / "examples/local.toml")])
    assert json.loads(result.output)["ok"] is True


def test_check_names_the_key_and_exits_1(tmp_path: Path) -> None:
    result = check(tmp_path, '[engine]\nmodel = "m"\nport = "eighty"\n')
    assert result.exit_code == 1
    assert "engine.port: Input should be a valid integer" in result.output
    assert "Traceback" not in result.output


def test_fingerprint_prints_hash(repo: Path) -> None:
    result = CliRunner().invoke(main, ["config", "fingerprint", str(repo / "examples/local.toml")])
    assert result.exit_code == 0 and len(result.output.strip()) == 64


def test_help_lists_commands() -> None:
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0 and "config" in result.output


def test_check_refuses_more_gateway_lanes_than_the_engine_has(tmp_path: Path) -> None:
    result = check(tmp_path, '[engine]\nmodel = "m"\nparallel = 2\n[api]\nparallel = 4\n')
    assert result.exit_code == 1
    assert "api.parallel (4) must not exceed engine.parallel (2)" in result.output


def test_the_gateways_lanes_default_to_the_engines(tmp_path: Path) -> None:
    result = check(tmp_path, '[engine]\nmodel = "m"\nparallel = 2\n', "--json")
    assert result.exit_code == 0, result.output
    worker = (  # the worker runs no gateway: its [api] is not checked
        '[node]\nrank = 1\n[engine]\nmodel = "m"\nparallel = 1\ntp = 2\n'
        '[fabric]\naddress = "198.51.100.1"\npeer = "198.51.100.2"\n[api]\nparallel = 4\n'
    )
    assert check(tmp_path, worker, name="worker.toml").exit_code == 0
