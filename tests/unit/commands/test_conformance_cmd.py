"""``sparkfold conformance``: a table, and exit 1 when a required check fails."""

from __future__ import annotations

import socket

from click.testing import CliRunner

from sparkfold.cli import main


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unreachable_server_fails_with_the_health_check_named() -> None:
    result = CliRunner().invoke(main, ["conformance", f"http://127.0.0.1:{closed_port()}", "--timeout", "2"])
    assert result.exit_code == 1
    assert result.output.startswith("health  FAIL")
    assert "conformance: 0 of 1 checks passed" in result.output
