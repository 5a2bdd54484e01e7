"""tests/process_guard.py: a pytest session that leaves a process of its own behind fails, naming it
and the test that started it, and the process is gone afterwards; one that cleans up passes.

Each case is a real inner pytest session (a child process) on a test file written here; the
leaked process is a ``setsid`` child whose parent has exited, as a tensorfold rank is once its
supervisor was SIGKILLed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[2]
CONFTEST = "from tests.process_guard import *  # noqa: F403\n"

LEAKS = """
import subprocess, sys

def test_leaks_an_orphan():
    # the middle process starts a session leader and exits: the grandchild is re-parented away
    sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
    code = f"import subprocess; subprocess.Popen({sleeper!r}, start_new_session=True)"
    subprocess.run([sys.executable, "-c", code], check=True)
"""

CLEAN = """
import subprocess, sys

def test_stops_what_it_starts():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    proc.kill()
    proc.wait(timeout=30)
"""


def inner_session(folder: Path, test: str) -> subprocess.CompletedProcess[str]:
    (folder / "conftest.py").write_text(CONFTEST)
    (folder / "test_inner.py").write_text(test)
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(folder)]
    return subprocess.run(
        command, cwd=folder, env=env, capture_output=True, text=True, timeout=120, check=False
    )


def test_a_session_that_leaves_a_process_fails_and_names_it(tmp_path: Path) -> None:
    done = inner_session(tmp_path, LEAKS)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 passed" in done.stdout, "the test itself passed: the session fails for the leftover"
    found = re.search(
        r"pid (\d+) \(.*time\.sleep\(120\).*\), started during test_inner\.py::test_leaks_an_orphan",
        done.stdout,
    )
    assert found, done.stdout
    assert not psutil.pid_exists(int(found.group(1))) or psutil.Process(int(found.group(1))).status() == (
        psutil.STATUS_ZOMBIE
    ), "the guard kills what it reports"


def test_a_session_that_stops_its_processes_passes(tmp_path: Path) -> None:
    done = inner_session(tmp_path, CLEAN)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "processes left behind" not in done.stdout
