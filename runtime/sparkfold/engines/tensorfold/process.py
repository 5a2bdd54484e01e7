"""Run one TensorFold rank from its :class:`~sparkfold.engines.tensorfold.LaunchPlan` and watch it.

:class:`RankProcess` is what the rank supervisor drives::

    rank = RankProcess(plan, on_line=journal.write)
    rank.start()                     # docker rm -f leftover; docker run … (or tensorfold serve …)
    rank.wait_ready(progress=print)  # rank 1: its ready line; rank 0: /health "ok": true
    ...                              # sd_notify READY, peer watch, WATCHDOG pings
    rank.stop()                      # docker stop -t N (or SIGTERM, then SIGKILL after N s)

Every output line of the rank goes to ``on_line`` (default: the ``sparkfold.engines.tensorfold``
logger, which reaches the journal). Failures raise :class:`RankStartError` with one line that says
what happened and the rank's last words.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping

import httpx

from sparkfold.config import Settings
from sparkfold.engines.tensorfold.launch import (
    LaunchPlan,
    follower_ready_s,
    health_is_ready,
    image_label_argv,
    progress_note,
    serving_line,
)

__all__ = ["RankProcess", "RankStartError", "image_key"]

_log = logging.getLogger("sparkfold.engines.tensorfold")
TAIL_LINES = 25
PROGRESS_EVERY_S = 15.0
POLL_S = 1.0
KILL_GRACE_S = 10.0


def image_key(settings: Settings, env: Mapping[str, str] | None = None) -> str | None:
    """The engine image's series hash (12 hex digits) for naming its kernel cache; None if unknown.

    An image without sparkfold's label (the reference recipe's published image) is named by its
    ``tf.patches`` label, as the recipe names its kernel cache.

    Unknown: the host launcher, no such image, no label, or docker not answering. The caller then
    passes None to :func:`~sparkfold.engines.tensorfold.launch_plan`, which names the cache
    folder after the image reference instead.
    """
    if settings.engine.tensorfold.launcher != "docker":
        return None
    try:
        result = subprocess.run(
            image_label_argv(settings),
            env=dict(os.environ if env is None else env),
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if result.returncode != 0:
        return None
    labels = result.stdout.split()
    if labels and re.fullmatch(r"[0-9a-f]{64}", labels[0]):
        return labels[0][:12]
    recipe = labels[-1] if labels else ""  # a published recipe image: its tf.patches label
    return recipe if re.fullmatch(r"[0-9a-f]{12}", recipe) else None


class RankStartError(RuntimeError):
    """The rank exited, or did not become ready in time; the message is one line for the operator."""


class RankProcess:
    """One rank's process (the ``docker run`` client, or ``tensorfold serve`` on the host)."""

    def __init__(
        self,
        plan: LaunchPlan,
        *,
        on_line: Callable[[str], None] | None = None,
        base_env: Mapping[str, str] | None = None,
    ) -> None:
        self.plan = plan
        self._on_line = on_line or (lambda line: _log.info("rank %d | %s", plan.rank, line))
        self._base_env = dict(os.environ if base_env is None else base_env)
        self._process: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None
        self._tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self._ready = threading.Event()
        self._wake = threading.Event()
        self._note = ""
        self.port_open_at: float | None = None  # time.monotonic() of the engine port's first answer
        self.serving_url: str | None = None

    # --- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        """Create the cache folders, remove a leftover container of the same name, start the rank."""
        if self._process is not None:
            raise RuntimeError("this rank was already started")
        for directory in self.plan.directories:
            directory.mkdir(parents=True, exist_ok=True)
        if self.plan.container:
            self._docker("rm", "-f", self.plan.container, timeout_s=60)
        try:
            self._process = self._popen()
        except OSError as exc:
            raise RankStartError(f"rank {self.plan.rank}: cannot run {self.plan.argv[0]}: {exc}") from None
        self._reader = threading.Thread(target=self._read, name=f"rank{self.plan.rank}-output", daemon=True)
        self._reader.start()

    def _popen(self) -> subprocess.Popen[str]:
        return subprocess.Popen(
            list(self.plan.argv),
            env=self._base_env | dict(self.plan.env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            bufsize=1,
            start_new_session=True,  # signals for the rank never reach the supervisor, and back
        )

    def _read(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        for raw in self._process.stdout:
            line = raw.rstrip("\n")
            self._tail.append(line)
            try:
                self._on_line(line)
            except Exception:  # a failing sink must not stop the draining of the rank's output
                _log.exception("rank %d: could not pass on an output line", self.plan.rank)
            if follower_ready_s(line) is not None:
                self._ready.set()
                self._wake.set()
            served = serving_line(line)
            if served is not None:
                self.serving_url = served.url
            note = progress_note(line)
            if note:
                self._note = note
        self._wake.set()  # end of output: the process is exiting

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    @property
    def returncode(self) -> int | None:
        return None if self._process is None else self._process.poll()

    @property
    def tail(self) -> list[str]:
        """The rank's last output lines (for an error report)."""
        return list(self._tail)

    def wait(self, timeout_s: float | None = None) -> int:
        """Wait for the rank to exit; its exit code."""
        if self._process is None:
            raise RuntimeError("this rank was never started")
        code = self._process.wait(timeout_s)
        if self._reader is not None:
            self._reader.join(timeout=5)
        return code

    # --- readiness ------------------------------------------------------------------------------

    def wait_ready(
        self,
        timeout_s: float | None = None,
        *,
        progress: Callable[[str], None] | None = None,
        progress_every_s: float = PROGRESS_EVERY_S,
        poll_s: float = POLL_S,
    ) -> float:
        """Block until the rank is ready; seconds it took. Raises :class:`RankStartError`.

        Rank 1 is ready at its ``ready … following rank 0`` line, rank 0 once ``/health`` says
        ``"ok": true``. A rank that exits first, or is not ready within ``timeout_s`` (default the
        plan's ``ready_timeout_s``), is an error; a rank that timed out is left running for the
        caller to stop.
        """
        if self._process is None:
            raise RuntimeError("start the rank before waiting for it")
        timeout_s = self.plan.ready_timeout_s if timeout_s is None else timeout_s
        started = time.monotonic()
        next_progress = started + progress_every_s
        # trust_env=False: a proxy from the environment must never sit between us and loopback
        with httpx.Client(timeout=min(5.0, max(poll_s, 0.5)), trust_env=False) as client:
            while True:
                elapsed = time.monotonic() - started
                if self._ready.is_set() or self._healthy(client):
                    return elapsed
                code = self._process.poll()
                if code is not None:
                    self.wait()
                    raise RankStartError(self._exited_message(code))
                if elapsed >= timeout_s:
                    raise RankStartError(
                        f"rank {self.plan.rank} not ready after {elapsed:.0f} s "
                        "(engine.tensorfold.ready_timeout_s); it is still running"
                    )
                if progress is not None and time.monotonic() >= next_progress:
                    note = f"; {self._note}" if self._note else ""
                    progress(f"rank {self.plan.rank}: {elapsed:.0f} s elapsed, not ready yet{note}")
                    next_progress += progress_every_s
                self._wake.wait(poll_s)
                self._wake.clear()

    def _healthy(self, client: httpx.Client) -> bool:
        if self.plan.health_url is None:
            return False
        try:
            response = client.get(self.plan.health_url)
            if self.port_open_at is None:
                self.port_open_at = time.monotonic()  # its first answer, ready or not
            return response.status_code == 200 and health_is_ready(response.json())
        except (httpx.HTTPError, ValueError):
            return False

    def _exited_message(self, code: int) -> str:
        last = next((line for line in reversed(self._tail) if line.strip()), "no output")
        return f"rank {self.plan.rank} exited (code {code}) before it was ready: {last}"

    # --- stop -----------------------------------------------------------------------------------

    def stop(self, timeout_s: float | None = None) -> int | None:
        """Stop the rank: ``docker stop -t N`` (or SIGTERM), SIGKILL after N s; its exit code."""
        process = self._process
        if process is None:
            return None
        if process.poll() is None:
            grace = self.plan.stop_timeout_s if timeout_s is None else timeout_s
            stopped = False
            if self.plan.container:
                stopped = self._docker(
                    "stop", "-t", str(round(grace)), self.plan.container, timeout_s=grace + 60
                )
            if not stopped:
                self._signal(signal.SIGTERM)
            try:
                # after a docker stop the container is gone; its client only has to notice
                process.wait(KILL_GRACE_S if stopped else grace)
            except subprocess.TimeoutExpired:
                _log.warning("rank %d: still running %.0f s after SIGTERM: SIGKILL", self.plan.rank, grace)
                self._signal(signal.SIGKILL)
        return self.wait()

    def _docker(self, *args: str, timeout_s: float) -> bool:
        """Run a docker subcommand (the plan's docker executable); True when it succeeded."""
        try:
            result = subprocess.run(
                [self.plan.argv[0], *args],
                env=self._base_env,
                capture_output=True,
                text=True,
                check=False,
                timeout=timeout_s,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            _log.warning("rank %d: %s %s failed: %s", self.plan.rank, self.plan.argv[0], args[0], exc)
            return False
        return result.returncode == 0

    def _signal(self, signum: int) -> None:
        assert self._process is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._process.pid, signum)
