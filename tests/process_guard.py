"""A test session fails if it leaves a process of its own behind.

Every process a test starts inherits this session's mark in its environment
(``SPARKFOLD_TEST_SESSION``) and the id of the test that was running (``SPARKFOLD_TEST_NODE``), so
a child is still found after its parent died and it was re-parented to PID 1 (a ``setsid`` rank
whose supervisor was SIGKILLed, a daemonised helper). At the end of the session, after every
fixture's teardown, the guard waits a little for exiting processes, then names each one still
running with the test that started it, kills it by PID and sets the session's exit status to 1.

Kept on purpose, and not counted: the testbed's machines when ``SPARKFOLD_TESTBED_KEEP=1`` (their
``systemd-nspawn``, the package server, ``python -m http.server``, and the engine image registry,
``docker-registry``), and OpenSSH's
connection-sharing masters (``ssh: … [mux]``, which Ansible's ControlPersist keeps for 60 s); the
guard ends those masters too. A child started with an environment built from nothing
(``env={"PATH": …}``) carries no mark and is not seen.

psutil finds the processes; the mark is ours because psutil can only tell a process's ancestry
while its parent lives.
"""

from __future__ import annotations

import os
import uuid

import psutil
import pytest

__all__ = ["pytest_configure", "pytest_runtest_setup", "pytest_runtest_teardown", "pytest_sessionfinish"]

SESSION = "SPARKFOLD_TEST_SESSION"
NODE = "SPARKFOLD_TEST_NODE"
EXIT_WAIT_S = 5.0


def pytest_configure(config: pytest.Config) -> None:
    os.environ[SESSION] = f"{os.getpid()}-{uuid.uuid4().hex}"  # an inner pytest run gets its own
    os.environ[NODE] = "(collection)"


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    os.environ[NODE] = item.nodeid


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    os.environ[NODE] = "(between tests: a fixture's teardown)"


def marked(mark: str) -> list[tuple[psutil.Process, str]]:
    """Processes other than this one whose environment carries ``mark``, with the test that started each."""
    found = []
    for proc in psutil.process_iter():
        if proc.pid == os.getpid():
            continue
        try:
            environ = proc.environ()
        except (psutil.Error, OSError):
            continue  # gone, a zombie, or not ours to read
        if environ.get(SESSION) == mark:
            found.append((proc, environ.get(NODE, "?")))
    return found


def kept(proc: psutil.Process) -> str | None:
    """Why ``proc`` may outlive the session: ``"mux"`` (end it quietly), ``"testbed"`` (leave it)."""
    try:
        argv = proc.cmdline()
    except psutil.Error:
        return "mux"  # gone meanwhile
    if argv and argv[0].startswith("ssh: ") and argv[-1].endswith("[mux]"):
        return "mux"
    machine = bool(argv) and os.path.basename(argv[0]) == "systemd-nspawn"
    package_server = argv[1:3] == ["-m", "http.server"]
    registry = bool(argv) and os.path.basename(argv[0]) == "docker-registry"
    if os.environ.get("SPARKFOLD_TESTBED_KEEP") == "1" and (machine or package_server or registry):
        return "testbed"  # the testbed's machines, their package server and registry, kept on request
    return None


def describe(proc: psutil.Process, node: str) -> str:
    try:
        argv = " ".join(proc.cmdline())
    except psutil.Error:
        argv = "?"
    return f"pid {proc.pid} ({argv[:200]}), started during {node}"


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """Runs after the session's fixtures are torn down (trylast: after pytest's own sessionfinish)."""
    started = dict(marked(os.environ[SESSION]))
    _, alive = psutil.wait_procs(list(started), timeout=EXIT_WAIT_S)
    leaked = []
    for proc in alive:
        reason = kept(proc)
        if reason is None:
            leaked.append(describe(proc, started[proc]))
        if reason != "testbed":
            end(proc)
    if not leaked:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.ensure_newline()
        reporter.write_sep("=", "processes left behind", red=True)
        reporter.write_line(
            "this session left processes running (killed now; fix the teardown that should stop them):"
        )
        for line in leaked:
            reporter.write_line(f"  {line}")
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


def end(proc: psutil.Process) -> None:
    """SIGKILL one process by PID (psutil checks it is still the same process)."""
    try:
        proc.kill()
        proc.wait(timeout=EXIT_WAIT_S)
    except (psutil.NoSuchProcess, psutil.TimeoutExpired):
        pass
