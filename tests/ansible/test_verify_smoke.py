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
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
from local_head import ansible, write_inventory

from sparkfold.api.reasoning import ReasoningControls, reasoning_controls

KEY = "sk-sf-smoke-test-key"
MODEL = "GLM-5.3-Flash-EXL3"


class _ThinkingGateway(BaseHTTPRequestHandler):
    requests: ClassVar[list[dict[str, Any]]] = []
    thinking: ClassVar[list[bool]] = []

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _reply(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
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
        if controls.enable_thinking is False:
            message = {"role": "assistant", "content": "OK", "reasoning_content": None}
            used, finish = 2, "stop"
        else:  # the engine's default (thinking on): the budget ends inside <think>
            message = {"role": "assistant", "content": "", "reasoning_content": "The user wants" * budget}
            used, finish = budget, "length"
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
    _ThinkingGateway.requests, _ThinkingGateway.thinking = [], []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ThinkingGateway)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


def verify(repo: Path, folder: Path, gateway: ThreadingHTTPServer) -> subprocess.CompletedProcess[str]:
    hosts = write_inventory(
        folder,
        ansible_host="127.0.0.1",
        sparkfold_api_port=gateway.server_address[1],
        sparkfold_api_keys=[KEY],
        sparkfold_engine_thinking=True,
        sparkfold_verify_timeout_s=10,
        sparkfold_verify_poll_s=1,
    )
    return ansible(repo, "ansible-playbook", "-i", str(hosts), "playbooks/verify.yml")


def test_the_smoke_request_gets_an_answer_from_a_thinking_engine(
    repo: Path, tmp_path: Path, gateway: ThreadingHTTPServer
) -> None:
    (tmp_path / "control").mkdir()  # an earlier stage made it
    result = verify(repo, tmp_path, gateway)
    assert result.returncode == 0, result.stdout + result.stderr
    (request,) = _ThinkingGateway.requests
    assert request["max_tokens"] == 16  # the smoke's budget is unchanged: thinking is what goes
    assert _ThinkingGateway.thinking == [False]
    assert KEY not in result.stdout + result.stderr


def test_verify_runs_alone_from_a_control_host_no_other_stage_ran_on(
    repo: Path, tmp_path: Path, gateway: ThreadingHTTPServer
) -> None:
    result = verify(repo, tmp_path, gateway)  # no control folder yet: the key is the vault's
    assert result.returncode == 0, result.stdout + result.stderr
    curl = (tmp_path / f"control/{tmp_path.name}-curl.txt").read_text()
    assert curl.startswith(f"curl http://127.0.0.1:{gateway.server_address[1]}/v1/chat/completions")
    assert KEY not in curl
