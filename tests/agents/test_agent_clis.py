"""The coding agents users run (Claude Code, Codex, opencode; pinned in package-lock.json) drive the
gateway end to end, headless, configured exactly as docs/agents.md says.

Each agent gets one prompt; the scripted engine behind the real ``sparkfold api`` answers with a
call to the agent's own shell tool (write a file in the agent's working directory), then, once the
tool result is back, with a final answer. Every test asserts: the agent exits 0, the file holds the
text, the tool result came back in the engine's second request, and the gateway answered nothing
with a 4xx or 5xx (a client that retries a refused request would otherwise hide it).

Nothing leaves the machine: the agents' own traffic (updates, telemetry) is switched off by the
docs' settings, and a proxy that refuses every connection stands in for the internet, so a call
home fails at once instead of passing where a network happens to be.
"""

from __future__ import annotations

import json
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from agent_turn import (
    BIN,
    REPO,
    AgentGateway,
    ShellTurn,
    doc_block,
    doc_command,
    doc_env,
    doc_file,
    run_agent,
)

pytestmark = pytest.mark.agents

NO_INTERNET = "http://127.0.0.1:9"
"""A proxy address where nothing listens: any connection past loopback is refused at once."""


@pytest.fixture(autouse=True)
def installed() -> None:
    if not BIN.is_dir():
        pytest.fail("the agent CLIs are not installed: run `npm ci` in tests/agents (make test-agents does)")


def base_env(home: Path) -> dict[str, str]:
    """A clean environment: a fresh HOME, no proxy but the refusing one, loopback exempt."""
    home.mkdir()
    keep = {name: os.environ[name] for name in ("PATH", "LANG", "TERM") if name in os.environ}
    return {
        **keep,
        "PATH": f"{BIN}{os.pathsep}{keep.get('PATH', '/usr/bin:/bin')}",
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_DATA_HOME": str(home / ".local/share"),
        "HTTP_PROXY": NO_INTERNET,
        "HTTPS_PROXY": NO_INTERNET,
        "ALL_PROXY": NO_INTERNET,
        "NO_PROXY": "127.0.0.1,localhost",
    }


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    return work


def check_turn(gateway: AgentGateway, turn: ShellTurn, result: object) -> None:
    output = f"{getattr(result, 'stdout', '')[-3000:]}\n{getattr(result, 'stderr', '')[-3000:]}"
    assert getattr(result, "returncode", None) == 0, output
    assert turn.target.read_text() == turn.text, output
    asked_engine = gateway.shell_requests()
    roles = [[m["role"] for m in r["messages"]] for r in asked_engine]
    assert len(asked_engine) >= 2 and "tool" not in roles[0], roles  # (later ones: the agent's own)
    # The turn that carries the tool's result back: an agent's own requests that offer the shell tool
    # too (Claude Code's side requests, its system prompt and tools alike) may come before it on a
    # busy machine.
    second = next(
        (r for r in asked_engine[1:] if "tool" in {m["role"] for m in r["messages"]}), asked_engine[1]
    )
    asked = [c for m in second["messages"] if m["role"] == "assistant" for c in m.get("tool_calls") or []]
    results = [m for m in second["messages"] if m["role"] == "tool"]
    assert [c["function"]["name"] for c in asked] == turn.calls, second["messages"]
    assert [r["tool_call_id"] for r in results] == [c["id"] for c in asked]
    assert turn.text in json.dumps(results[0]["content"])
    refused = [line for line in gateway.answered() if not 200 <= line[2] < 400]
    assert not refused, refused


@dataclass(frozen=True)
class Agent:
    """One CLI: its blocks in ``docs/agents.md`` (``DOCS-env``, ``DOCS-config``, ``DOCS-run``), its
    shell tool, where its configuration file goes (relative to its HOME or to its working
    directory), and the block whose lines open that file, if any (a setting the page offers)."""

    docs: str
    shell: str
    config_in_home: str | None = None
    config_in_workdir: str | None = None
    config_opened_by: str | None = None


def config_file(agent: Agent, gateway: AgentGateway) -> str:
    """The agent's configuration file: its ``DOCS-config`` block, after the block that opens it."""
    blocks = [agent.config_opened_by] if agent.config_opened_by is not None else []
    return "".join(doc_file(name, gateway.url, gateway.key) for name in [*blocks, f"{agent.docs}-config"])


CODEX_CONFIG = ".codex/config.toml"
AGENTS = {
    "claude-code": Agent("claude-code", "Bash"),
    # on its own default model, Codex offers its shell inside a JavaScript exec (a custom tool)
    "codex": Agent("codex", "functions.exec", config_in_home=CODEX_CONFIG),
    # naming the served model, it falls back to plain function tools (exec_command)
    "codex-served-model": Agent(
        "codex", "exec_command", config_in_home=CODEX_CONFIG, config_opened_by="codex-model"
    ),
    "opencode": Agent("opencode", "bash", config_in_workdir="opencode.json"),
}


@pytest.mark.parametrize("name", AGENTS)
def test_the_agent_runs_its_shell_tool_through_the_gateway(tmp_path: Path, workdir: Path, name: str) -> None:
    agent = AGENTS[name]
    turn = ShellTurn(workdir / "hello.txt", f"hello from {name}")
    gateway = AgentGateway(tmp_path, turn)
    with gateway.running():
        env = base_env(tmp_path / "home") | doc_env(f"{agent.docs}-env", gateway.url, gateway.key)
        for base, place in ((Path(env["HOME"]), agent.config_in_home), (workdir, agent.config_in_workdir)):
            if place is not None:
                (base / place).parent.mkdir(parents=True, exist_ok=True)
                (base / place).write_text(config_file(agent, gateway))
        argv = doc_command(f"{agent.docs}-run")
        result = run_agent(argv, workdir, env)
    check_turn(gateway, turn, result)
    assert turn.calls == [agent.shell]


def test_the_page_aliases_are_the_example_inventorys() -> None:
    """The aliases the tests run with (the page's) are the ones a pair provisioned from the example
    inventory serves, so the agents' default names answer there as they do here."""
    page = tomllib.loads(doc_block("gateway-aliases"))["api"]["model_aliases"]
    inventory = yaml.safe_load((REPO / "inventory/example/group_vars/all/api.yml").read_text())
    assert page == inventory["sparkfold_api_model_aliases"]
