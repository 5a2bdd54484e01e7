"""The upgrade drill's parts: the previous release converged, and streams held open across today's
converge of the pair over it (conftest.py's ``previous`` and ``upgrade`` fixtures; test_upgrade.py).

From the start of the service stage's play (the restarts come after it, playbooks/restart.yml),
streams run through the gateway one after another, until one is cut by the engine's restart or the
converge ends. Each is bounded (``MAX_STREAMS``; httpx's timeout between two lines).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from testbed_kit import Run, stream_chat
from tests.releases import Release

SERVICE_PLAY = "Install and run the sparkfold services"  # playbooks/stages/service.yml
MAX_STREAMS = 100


@dataclass
class Previous:
    """The previous release converged on the pair from its own tree (``tree``)."""

    release: Release
    tree: Path
    run: Run
    versions: dict[str, str]  # node address -> `sparkfold --version` right after the converge


@dataclass
class Stream:
    status: int
    lines: list[str]

    @property
    def accepted(self) -> bool:
        """The gateway answered 200: the engine had taken the request, since the gateway sends its
        status only after the engine's (api/upstream.py, ``Engine.open_stream``)."""
        return self.status == 200

    @property
    def opened(self) -> bool:
        """It answered 200 and its first event was a chunk, not an error."""
        first = next((line for line in self.lines if line), "")
        return self.status == 200 and first.startswith("data: {") and '"error"' not in first

    @property
    def cut(self) -> bool:
        return any(line.startswith("data: {") and '"error"' in line for line in self.lines)

    @property
    def done(self) -> bool:
        return [line for line in self.lines if line][-1:] == ["data: [DONE]"]


@dataclass
class Streams:
    """Streams one after another from ``go`` until one is cut, ``stop`` is set or MAX_STREAMS ran."""

    api_key: str
    go: threading.Event = field(default_factory=threading.Event)
    stop: threading.Event = field(default_factory=threading.Event)
    ran: list[Stream] = field(default_factory=list)

    def on_event(self, event: dict[str, Any]) -> None:
        """ansible-runner's event hook: the service stage's play starts the streams."""
        if event.get("event") == "playbook_on_play_start" and event["event_data"].get("play") == SERVICE_PLAY:
            self.go.set()

    def run(self) -> None:
        self.go.wait()
        while not self.stop.is_set() and len(self.ran) < MAX_STREAMS:
            stream = Stream(0, [])
            self.ran.append(stream)
            try:
                stream.status = stream_chat(self.api_key, stream.lines)
            except httpx.HTTPError as error:
                stream.lines.append(f"{type(error).__name__}: {error}")
            if stream.cut or not stream.opened:
                return


@dataclass
class Upgrade:
    """Today's first converge of the pair: over the previous release (``previous``), with the
    streams it cut and what systemd says right after it; or, with no release to upgrade from
    (``skipped`` says why), a first converge of a fresh pair."""

    run: Run
    previous: Previous | None = None
    skipped: str = ""
    streams: list[Stream] = field(default_factory=list)
    streams_hung: bool = False
    units: dict[str, dict[str, str]] = field(default_factory=dict)  # "head engine" -> systemctl show
    starts: dict[str, int] = field(default_factory=dict)  # "head engine" -> systemd starts in the run
