"""The verify stage's smoke request against a pair whose engine thinks by default (the example
inventory: ``sparkfold_engine_thinking: true``), as GLM-5.3 does on a real pair.

GLM spends its first tokens inside ``<think>``: with the smoke's budget (``sparkfold_verify_max_tokens``,
16) a thinking reply is all ``reasoning_content`` and its ``content`` is empty, so the smoke must turn
thinking off to see an answer. The testbed cannot show this (its CPU engine and the TensorFold
stand-in answer at once). The gateway here is a loopback HTTP server that reads the request's
reasoning fields with the real gateway's parser (:func:`sparkfold.api.reasoning.reasoning_controls`)
and replies as GLM does: thinking on (the default) spends the whole budget on reasoning.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
from local_head import ansible, install_sparkfold, write_inventory

from sparkfold.api.reasoning import ReasoningControls, reasoning_controls

KEY = "sk-sf-smoke-test-key"
MODEL = "GLM-5.3-Flash-EXL3"


class _ThinkingGateway(BaseHTTPRequestHandler):
    requests: ClassVar[list[dict[str, Any]]] = []
    thinking: ClassVar[list[bool]] = []
    keys: ClassVar[list[str]] = []
    thinking_always: ClassVar[bool] = False

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _reply(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, message: dict[str, Any], finish: str, used: int) -> None:
        delta = {key: value for key, value in message.items() if key != "role" and value}
        chunks = [
            {"choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
            {"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]},
            {
                "choices": [],
                "usage": {"prompt_tokens": 9, "completion_tokens": used, "total_tokens": 9 + used},
            },
        ]
        data = b"".join(f"data: {json.dumps(chunk)}\n\n".encode() for chunk in chunks) + b"data: [DONE]\n\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/health":
            self._reply(200, {"status": "ok"})
        elif self.path == "/v1/models":
            self._reply(200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})
        else:
            self._reply(404, {"error": {"message": "not found"}})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append(body)
        controls = reasoning_controls(
            reasoning_effort=body.get("reasoning_effort"),
            template_kwargs=body.get("chat_template_kwargs") or {},
            thinking=body.get("thinking"),
            reasoning=body.get("reasoning"),
        )
        assert isinstance(controls, ReasoningControls), controls
        budget = int(body["max_tokens"])
        type(self).thinking.append(controls.enable_thinking is not False)
        if controls.enable_thinking is False and not type(self).thinking_always:
            message = {"role": "assistant", "content": "OK", "reasoning_content": None}
            used, finish = 2, "stop"
        else:  # the engine's default (thinking on): the budget ends inside <think>
            message = {"role": "assistant", "content": "", "reasoning_content": "The user wants" * budget}
            used, finish = budget, "length"
        type(self).keys.append(self.headers.get("Authorization", ""))
        if body.get("stream"):  # what the smoke sends (sparkfold startup --smoke): SSE, usage at the end
            self._stream(message, finish, used)
            return
        self._reply(
            200,
            {
                "object": "chat.completion",
                "model": MODEL,
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": {"prompt_tokens": 9, "completion_tokens": used, "total_tokens": 9 + used},
            },
        )


@pytest.fixture
def gateway() -> Iterator[ThreadingHTTPServer]:
    _ThinkingGateway.requests, _ThinkingGateway.thinking, _ThinkingGateway.keys = [], [], []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ThinkingGateway)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


# systemd's record of the engine unit's start, as `systemctl show` prints it: started at 1000 s, READY
# 437.1 s later (the recipe's pair loads in 433-441 s).
SYSTEMCTL = """#!/bin/sh
[ "$1" = show ] || exit 5
printf 'ExecMainStartTimestampMonotonic=1000000000\nExecMainPID=4242\n'
printf 'ActiveEnterTimestampMonotonic=1437100000\n'
"""


def verify(repo: Path, folder: Path, gateway: ThreadingHTTPServer) -> subprocess.CompletedProcess[str]:
    port = gateway.server_address[1]
    (folder / "etc").mkdir(exist_ok=True)
    (folder / "etc/sparkfold.toml").write_text(
        f'[engine]\nmodel = "/m"\nserved_name = "{MODEL}"\n[api]\nhost = "0.0.0.0"\nport = {port}\n'
    )
    (folder / "bin").mkdir(exist_ok=True)
    (folder / "bin/systemctl").write_text(SYSTEMCTL)
    (folder / "bin/systemctl").chmod(0o755)
    hosts = write_inventory(
        folder,
        ansible_host="127.0.0.1",
        sparkfold_api_port=port,
        sparkfold_api_keys=[KEY],
        sparkfold_engine_thinking=True,
        sparkfold_verify_timeout_s=10,
        sparkfold_verify_poll_s=1,
        sparkfold_config_dir=str(folder / "etc"),
        sparkfold_install_dir=str(install_sparkfold(repo, folder / "install")),
    )
    env = {"PATH": f"{folder / 'bin'}:{os.environ['PATH']}"}
    return ansible(repo, "ansible-playbook", "-i", str(hosts), "playbooks/verify.yml", env=env)


def test_the_smoke_request_gets_an_answer_from_a_thinking_engine(
    repo: Path, tmp_path: Path, gateway: ThreadingHTTPServer
) -> None:
    (tmp_path / "control").mkdir()  # an earlier stage made it
    result = verify(repo, tmp_path, gateway)
    assert result.returncode == 0, result.stdout + result.stderr
    (request,) = _ThinkingGateway.requests
    assert request["max_tokens"] == 16  # the smoke's budget is unchanged: thinking is what goes
    assert _ThinkingGateway.thinking == [False]
    assert request["stream"] is True  # ready means a token: the smoke request streams
    assert _ThinkingGateway.keys == [f"Bearer {KEY}"]  # the key reached the node's command on stdin
    assert KEY not in result.stdout + result.stderr
    shown = " ".join(result.stdout.split())  # the YAML callback wraps long lines
    assert "msg: 'OK: ''OK'' (2 tokens, streamed)'" in shown
    line = (
        "h1: sparkfold-engine.service (rank 0, pid 4242) from its start: port open ?, /health ready 437.1 s"
    )
    assert f"{line}, first streamed token " in shown, result.stdout


def test_a_thinking_reply_with_no_answer_fails_the_smoke(
    repo: Path, tmp_path: Path, gateway: ThreadingHTTPServer
) -> None:
    """Against the rule the smoke relies on: were thinking left on, the empty answer is caught."""
    _ThinkingGateway.thinking_always = True
    try:
        result = verify(repo, tmp_path, gateway)
    finally:
        _ThinkingGateway.thinking_always = False
    assert result.returncode != 0
    assert "the smoke request returned ''" in result.stdout


def test_verify_runs_alone_from_a_control_host_no_other_stage_ran_on(
    repo: Path, tmp_path: Path, gateway: ThreadingHTTPServer
) -> None:
    result = verify(repo, tmp_path, gateway)  # no control folder yet: the key is the vault's
    assert result.returncode == 0, result.stdout + result.stderr
    curl = (tmp_path / f"control/{tmp_path.name}-curl.txt").read_text()
    assert curl.startswith(f"curl http://127.0.0.1:{gateway.server_address[1]}/v1/chat/completions")
    assert KEY not in curl
