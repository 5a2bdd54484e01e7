"""Helpers to drive the testbed: ansible-runner runs of site.yml, ssh to a node, unit facts, polling.

ansible-runner starts ``ansible-playbook`` by name: the runs put this interpreter's bin folder (the
project's venv) first on PATH, so they work from ``make test`` without an activated venv.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
KEY = REPO / ".cache/testbed/id_ed25519"
HEAD, WORKER = "198.51.100.11", "198.51.100.12"
ADMIN = "sparkfold-admin"  # inventory/testbed/hosts.yml: the nodes' admin login (passwordless sudo)
API = f"http://{HEAD}:8888"
SERVED_NAME = "SmolLM2-135M-Instruct"  # inventory/testbed: the same name for either engine kind
NODES = {"sftb-head", "sftb-worker"}  # inventory/testbed: the pair's host names
SPARKFOLD = "/opt/sparkfold/venv/bin/sparkfold"  # the nodes' command (roles/sparkfold_runtime)
MODEL = "/var/lib/sparkfold/models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"  # the weights stage's copy
GIB_KB = 1024 * 1024
# What a serving Spark shows, scaled to the testbed: a GLM rank holds ~80 GiB and leaves ~8 GiB
# MemAvailable, below the ~110 GiB a start needs. Here 0.7 GiB: below the CPU engine's 1 GiB
# (preflight's default for the kind), above the memory guard's 0.5 GiB (half of the testbed's 1 GiB
# reserve), which sees the same /proc/meminfo. MemTotal stays the node's own (the memory budget reads it).
SERVING_SPARK = {"MemFree": int(0.3 * GIB_KB), "MemAvailable": int(0.7 * GIB_KB)}


@dataclass
class Run:
    """One ansible-runner run: its status, per-host stats, start (epoch s), wall time and output."""

    status: str
    rc: int
    stats: dict[str, dict[str, int]]
    wall_s: float
    output: str
    started_at: float = 0.0

    @property
    def changed(self) -> dict[str, int]:
        return self.stats.get("changed", {})

    def must_succeed(self) -> Run:
        assert self.status == "successful" and self.rc == 0, self.output[-6000:]
        return self

    def must_change_nothing(self) -> Run:
        """It succeeded on both nodes and changed nothing on either."""
        self.must_succeed()
        assert set(self.stats.get("ok", {})) == NODES
        assert sum(self.changed.values()) == 0, f"changed: {self.changed}"
        return self


def play(
    tmp: Path,
    playbook: str,
    *,
    tags: str = "",
    skip_tags: str = "",
    extravars: dict[str, Any] | None = None,
    check: bool = False,
    diff: bool = False,
    inventory: str = "inventory/testbed",
    verbosity: int = 0,
    root: Path = REPO,
    env: dict[str, str] | None = None,
    on_event: Callable[[dict[str, Any]], None] | None = None,
) -> Run:
    """``playbook`` and ``inventory`` of the checkout ``root`` (this one unless named: another release's
    tree), ``env`` added to ansible-playbook's environment; ``on_event`` sees each event as it comes."""
    import ansible_runner  # heavy; only the testbed needs it

    def handle(event: dict[str, Any]) -> bool:
        if on_event:
            on_event(event)
        return True  # keep the event in the artifacts

    tmp.mkdir(parents=True, exist_ok=True)
    started_at, started = time.time(), time.monotonic()
    result = ansible_runner.run(
        private_data_dir=str(tmp),
        project_dir=str(root),
        playbook=str(root / playbook),
        inventory=str(root / inventory),
        extravars=extravars or {},
        tags=tags or None,
        skip_tags=skip_tags or None,
        cmdline=" ".join(flag for flag, on in (("--check", check), ("--diff", diff)) if on) or None,
        verbosity=verbosity or None,
        envvars={
            "ANSIBLE_CONFIG": str(root / "ansible.cfg"),
            "ANSIBLE_NOCOLOR": "1",
            "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
            **(env or {}),
        },
        event_handler=handle,
        quiet=True,
    )
    wall = time.monotonic() - started
    output = result.stdout.read() if result.stdout else ""
    return Run(result.status, result.rc, result.stats or {}, wall, output, started_at)


def ssh_argv(address: str, user: str = ADMIN) -> list[str]:
    """``ssh`` to a testbed node as ``user`` with the testbed key, no prompts."""
    return [
        "ssh",
        "-i",
        str(KEY),
        "-o",
        "BatchMode=yes",
        "-o",
        "StrictHostKeyChecking=no",
        "-o",
        "UserKnownHostsFile=/dev/null",
        "-o",
        "LogLevel=ERROR",
        f"{user}@{address}",
    ]


def ssh(address: str, command: str, *, check: bool = True, stdin: str | None = None) -> str:
    """Run ``command`` as root on a testbed node (the admin login, through sudo); return stdout."""
    argv = [*ssh_argv(address), f"sudo -n bash -c {shlex.quote(command)}"]
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=120, check=False)
    if check:
        assert done.returncode == 0, f"{command} on {address}: {done.stderr}"
    return done.stdout.strip()


def unit(address: str, name: str) -> dict[str, str]:
    """``systemctl show`` facts of a unit: MainPID, ActiveState, InvocationID, start time (monotonic µs)."""
    text = ssh(
        address, f"systemctl show -p MainPID,ActiveState,InvocationID,ExecMainStartTimestampMonotonic {name}"
    )
    return dict(line.split("=", 1) for line in text.splitlines())


def starts_since(address: str, name: str, epoch_s: float) -> int:
    """How many times systemd started ``name`` on the node since ``epoch_s`` (one clock: one kernel)."""
    text = ssh(address, f"journalctl -u {name} --since @{int(epoch_s)} -o cat --no-pager", check=False)
    return sum(line.startswith(f"Starting {name}") for line in text.splitlines())


def restarts_issued(run: Run, task: str, host: str) -> int:
    """How many times ``task`` (a task or handler name) reported changed on ``host`` in the run."""
    count, inside = 0, False
    for line in run.output.splitlines():
        if line.startswith(("TASK [", "RUNNING HANDLER [")):
            inside = f" : {task}]" in line or f"[{task}]" in line
        elif inside and line.startswith(f"changed: [{host}"):
            count += 1
    return count


def wait_for(what: str, probe: Callable[[], bool], timeout_s: float = 300, every_s: float = 2) -> None:
    """Poll ``probe`` until it is true; fail naming ``what`` after ``timeout_s`` (bounded)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if probe():
            return
        time.sleep(every_s)
    pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}")


def overlay_meminfo(real: str, figures: dict[str, int]) -> str:
    """``/proc/meminfo`` text with ``figures`` (field -> kB) in place of the node's own."""
    lines = []
    for line in real.splitlines():
        field = line.split(":", 1)[0]
        lines.append(f"{field}: {figures[field]:>10} kB" if field in figures else line)
    return "\n".join(lines) + "\n"


@contextmanager
def serving_spark_memory(*nodes: str) -> Iterator[None]:
    """The nodes' ``/proc/meminfo`` shows :data:`SERVING_SPARK` (a bind mount inside each) meanwhile."""
    try:
        for node in nodes:
            fake = overlay_meminfo(ssh(node, "cat /proc/meminfo"), SERVING_SPARK)
            bind = "mount --bind /run/serving-meminfo /proc/meminfo"
            ssh(node, f"cat > /run/serving-meminfo && {bind}", stdin=fake)
        yield
    finally:
        for node in nodes:
            ssh(node, "umount /proc/meminfo; rm -f /run/serving-meminfo", check=False)


def chat_reply(api_key: str) -> str | None:
    """One chat completion through the gateway on the head (the OpenAI SDK); None when it fails."""
    from openai import OpenAI, OpenAIError

    client = OpenAI(base_url=f"{API}/v1", api_key=api_key, timeout=60, max_retries=0)
    try:
        reply = client.chat.completions.create(
            model=SERVED_NAME,
            messages=[{"role": "user", "content": "Say hello."}],
            max_tokens=8,
            temperature=0,
        )
    except OpenAIError:
        return None
    return reply.choices[0].message.content or None


def stream_chat(
    api_key: str,
    lines: list[str],
    opened: threading.Event | None = None,
    *,
    prompt: str = "Count to 500.",
    max_tokens: int = 512,
) -> int:
    """One streamed chat completion through the gateway (by default a long one: "Count to 500.",
    512 tokens at most): its lines go into ``lines`` as they come, ``opened`` is set at the first
    one and at the end (a stream that never sends a line sets it too); returns the HTTP status."""
    body = {
        "model": SERVED_NAME,
        "stream": True,
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": prompt}],
    }
    headers = {"authorization": f"Bearer {api_key}"}
    opened = opened or threading.Event()
    try:
        with httpx.stream(
            "POST", f"{API}/v1/chat/completions", json=body, headers=headers, timeout=120
        ) as response:
            for line in response.iter_lines():
                lines.append(line)
                opened.set()
            return response.status_code
    finally:
        opened.set()


def chat_answers(api_key: str) -> bool:
    return chat_reply(api_key) is not None


def installed_version(address: str) -> str:
    """What ``sparkfold --version`` of the node's venv says (``sparkfold 0.4.0 (commit b99afa61d)``)."""
    return ssh(address, f"{SPARKFOLD} --version")


def invocations() -> dict[str, str]:
    """Each unit's InvocationID: a new one means systemd (re)started it."""
    ids = {f"{node} engine": unit(node, "sparkfold-engine")["InvocationID"] for node in (HEAD, WORKER)}
    return ids | {"api": unit(HEAD, "sparkfold-api")["InvocationID"]}
