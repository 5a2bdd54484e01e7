"""Progress, not "process alive": whether a serving TensorFold rank 0 still does its work.

The rank supervisor asks :meth:`Liveness.check` before each ``WATCHDOG=1``; the watchdog is fed
only while it answers ``ok``, so systemd restarts a rank that hangs with its process alive (a GLM
pair can hang silently: ``reference/tensorfold.md`` §14.3). Each check reads ``GET /health``:

- no answer, not 200, or ``"ok"`` not true: no progress;
- busy (``requests_running`` > 0): progress while a counter (``requests_total``,
  ``prompt_tokens_total``, ``completion_tokens_total``) moved within ``stall_s`` (``engine.stall_s``);
- idle: a one-token request (``POST /v1/completions``, ``max_tokens`` 1) every ``probe_every_s``,
  which goes through both ranks; until it answers again, no progress. A 429 counts as an answer
  (the engine is full of other work). A ``/health`` without counters (``{"status": "ok"}`` when
  TensorFold has its own API keys) is treated as idle: the probe decides.

Rank 1 has no HTTP port; its supervisor feeds the watchdog while its process runs and the peer
answers, and a hang there shows as rank 0's failed probe (the request needs both ranks).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

__all__ = ["Liveness", "Verdict"]

_COUNTERS = ("requests_total", "prompt_tokens_total", "completion_tokens_total")
HEALTH_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Verdict:
    """One check: did the rank make progress, and (when not) why, in one line."""

    ok: bool
    reason: str = ""


class Liveness:
    """Progress checks of rank 0's engine server at ``base_url`` (``http://127.0.0.1:18888``)."""

    def __init__(
        self,
        base_url: str,
        *,
        stall_s: float,
        probe_every_s: float,
        probe_timeout_s: float,
        client: httpx.Client | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.stall_s, self.probe_every_s, self.probe_timeout_s = stall_s, probe_every_s, probe_timeout_s
        # trust_env=False: a proxy from the environment must never sit between us and loopback
        self._client = client or httpx.Client(trust_env=False)
        self._clock = clock
        now = clock()
        self._counters: tuple[object, ...] | None = None
        self._moved_at = now
        self._probed_at = now  # READY came after a healthy /health: the first probe is due later
        self._probe_ok = True

    def close(self) -> None:
        self._client.close()

    def check(self) -> Verdict:
        """Progress since the last check? Never raises; a failure is a verdict."""
        try:
            reply = self._client.get(f"{self.base_url}/health", timeout=HEALTH_TIMEOUT_S)
            body = reply.json() if reply.status_code == 200 else None
        except (httpx.HTTPError, ValueError) as exc:
            return Verdict(False, f"/health does not answer: {exc or type(exc).__name__}")
        if not isinstance(body, dict) or not (body.get("ok") is True or body.get("status") == "ok"):
            return Verdict(False, f"/health answered {reply.status_code} {reply.text[:120]!r}")
        now = self._clock()
        counters = tuple(body.get(name) for name in _COUNTERS)
        if counters != self._counters:
            self._counters, self._moved_at = counters, now
        if int(body.get("requests_running") or 0) > 0:
            still = now - self._moved_at
            if still > self.stall_s:
                return Verdict(
                    False,
                    f"stalled: {body.get('requests_running')} request(s) running and no token counted "
                    f"for {still:.0f} s (engine.stall_s = {self.stall_s:g})",
                )
            return Verdict(True)
        if not self._probe_ok or now - self._probed_at >= self.probe_every_s:
            self._probe_ok = self._probe()
            self._probed_at = now
            if not self._probe_ok:
                return Verdict(False, self._probe_failure)
        return Verdict(True)

    def _probe(self) -> bool:
        try:
            reply = self._client.post(
                f"{self.base_url}/v1/completions",
                json={"prompt": "Hi", "max_tokens": 1, "temperature": 0},
                timeout=self.probe_timeout_s,
            )
        except httpx.HTTPError as exc:
            self._probe_failure = f"the 1-token probe got no answer: {exc or type(exc).__name__}"
            return False
        if reply.status_code in (200, 429):
            return True
        self._probe_failure = f"the 1-token probe answered {reply.status_code} {reply.text[:120]!r}"
        return False

    _probe_failure = ""
