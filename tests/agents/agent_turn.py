"""One agent turn against the real gateway: a scripted engine that asks the agent's shell tool to
write a file, then answers; the docs' configuration blocks; the gateway's access log.

The configuration an agent runs with is read from ``docs/agents.md``: each block the test uses is
the fenced block after a ``<!-- agent-test: NAME -->`` line, with the page's placeholders (the
pair's address ``http://spark-head:8888`` and ``YOUR_API_KEY``) swapped for the gateway under
test, so the page and the test cannot drift apart.
"""

from __future__ import annotations

import contextlib
import json
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.fakes.scripted_engine import Script, ScriptedEngine, ServerThread, free_port
from tests.integration.engine_procs import ChildProcess, wait_healthy

from sparkfold.config import EngineSettings

__all__ = ["AgentGateway", "ShellTurn", "doc_block", "doc_command", "doc_env", "doc_file", "run_agent"]

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "agents.md"
BIN = Path(__file__).resolve().parent / "node_modules" / ".bin"
PAIR_URL = "http://spark-head:8888"
KEY_PLACEHOLDER = "YOUR_API_KEY"
SERVED = EngineSettings.model_fields["served_name"].default
"""The gateway under test serves the default served name, as a pair does."""
SHELL_TOOLS = ("Bash", "bash", "exec_command", "shell", "functions.exec")
"""The shell tool of Claude Code, opencode and Codex (``exec_command``; ``shell`` in older releases;
on its own default model, ``exec`` of its ``functions`` namespace: a custom tool whose input is
JavaScript that calls ``exec_command``, offered by the gateway as a function of one ``input``)."""


def doc_block(name: str) -> str:
    """The fenced block after ``<!-- agent-test: NAME -->`` in docs/agents.md (AssertionError if none)."""
    pattern = rf"<!-- agent-test: {re.escape(name)} -->\s*```[^\n]*\n(.*?)```"
    found = re.search(pattern, DOC.read_text(), re.S)
    assert found, f"docs/agents.md has no block marked agent-test: {name}"
    return found.group(1)


def _localised(text: str, url: str, key: str) -> str:
    return text.replace(PAIR_URL, url).replace(KEY_PLACEHOLDER, key)


def doc_env(name: str, url: str, key: str) -> dict[str, str]:
    """The ``export NAME=VALUE`` lines of a block, pointed at ``url`` with ``key``."""
    env = {}
    for line in _localised(doc_block(name), url, key).splitlines():
        if line.startswith("export "):
            variable, _, value = line.removeprefix("export ").partition("=")
            env[variable] = shlex.split(value)[0] if value else ""
    return env


def doc_command(name: str) -> list[str]:
    """The block's one command line, as argv (its program from tests/agents/node_modules)."""
    lines = [line for line in doc_block(name).splitlines() if line.strip() and not line.startswith("#")]
    assert len(lines) == 1, f"agent-test: {name} should hold one command line"
    argv = shlex.split(lines[0])
    return [str(BIN / argv[0]), *argv[1:]]


def doc_file(name: str, url: str, key: str) -> str:
    """A configuration file's block, pointed at ``url`` with ``key``."""
    return _localised(doc_block(name), url, key)


@dataclass
class ShellTurn:
    """The scripted model of one agent turn: with the shell tool offered, call it to write ``target``;
    once a tool result came back, answer. A request without the shell tool (an agent's title or
    summary call) gets a short text."""

    target: Path
    text: str
    calls: list[str] = field(default_factory=list)
    """The shell tool's name, for each call made."""

    @property
    def command(self) -> str:
        return f"printf '%s' '{self.text}' > {self.target} && cat {self.target}"

    def __call__(self, request: dict[str, Any]) -> Script:
        if any(m.get("role") == "tool" for m in request.get("messages") or []):
            return Script(content=["Done", "."])
        tool = shell_tool(request)
        if tool is None:
            return Script(content=["Hello", "."])
        name, properties = tool["name"], tool.get("parameters", {}).get("properties", {})
        arguments: dict[str, Any]
        if name == "functions.exec":  # Codex's JavaScript exec (a custom tool)
            script = f"const ran = await tools.exec_command({{cmd: {json.dumps(self.command)}}});"
            arguments = {"input": f"{script}\ntext(ran.output);"}
        elif "cmd" in properties:  # Codex's exec_command
            arguments = {"cmd": self.command}
        elif properties.get("command", {}).get("type") == "array":  # Codex's older shell
            arguments = {"command": ["bash", "-lc", self.command]}
        else:
            arguments = {"command": self.command}
        if "description" in properties:
            arguments["description"] = "Write the file"
        self.calls.append(name)
        return Script(content=[], tool_calls=[(name, json.dumps(arguments))])


def shell_tool(request: Mapping[str, Any]) -> dict[str, Any] | None:
    """The offered shell tool's function block in an engine request, or None."""
    for tool in request.get("tools") or []:
        function = tool.get("function") or {}
        if function.get("name") in SHELL_TOOLS:
            return dict(function)
    return None


class AgentGateway:
    """``sparkfold api`` (a real process, an API key required) in front of a scripted engine."""

    def __init__(self, workdir: Path, turn: ShellTurn, key: str = "agent-test-key") -> None:
        self.workdir = workdir
        self.key = key
        self.engine = ScriptedEngine(responder=turn)
        self.log = workdir / "gateway.log"
        self.url = ""

    @contextlib.contextmanager
    def running(self) -> Iterator[AgentGateway]:
        keys = self.workdir / "api-keys"
        keys.write_text(self.key + "\n")
        port = free_port()
        config = self.workdir / "sparkfold.toml"
        with ServerThread(self.engine) as engine:
            lines = [
                "[engine]",
                'model = "scripted"',
                f"served_name = {json.dumps(SERVED)}",
                f"port = {engine.port}",
                "context = 131072",
                "max_tokens = 32768",
                "[api]",
                'host = "127.0.0.1"',
                f"port = {port}",
                f'api_keys_file = "{keys}"',
            ]
            lines.append(doc_block("gateway-aliases").split("[api]", 1)[1].strip())
            config.write_text("\n".join(lines) + "\n")
            process = ChildProcess(
                [
                    sys.executable,
                    "-c",
                    "from sparkfold.cli import main; main()",
                    "api",
                    "--config",
                    str(config),
                ],
                self.log,
            )
            self.url = f"http://127.0.0.1:{port}"
            try:
                wait_healthy(self.url, process, deadline_s=30)
                yield self
            finally:
                process.stop()

    def answered(self) -> list[tuple[str, str, int]]:
        """(method, path, status) of every request the gateway answered, from its access log."""
        lines = [json.loads(line) for line in self.log.read_text().splitlines() if line.startswith("{")]
        return [
            (line["method"], line["path"], line["status"])
            for line in lines
            if line.get("logger") == "sparkfold.api.access"
        ]

    def shell_requests(self) -> list[dict[str, Any]]:
        """The engine requests that offered the shell tool, in order."""
        return [r for r in self.engine.requests if shell_tool(r) is not None]


def run_agent(
    argv: list[str], cwd: Path, env: Mapping[str, str], timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    """Run an agent CLI headless (stdin closed), bounded in time."""
    return subprocess.run(
        argv,
        cwd=cwd,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
