"""The engine core's :class:`~sparkfold.engines.core.main.StepWriter`: an Outbox whose step is one message."""

from __future__ import annotations

import socket
import threading
from multiprocessing.connection import Connection

from sparkfold.engines.core import wire as core_wire
from sparkfold.engines.core.main import StepWriter, _Stream
from sparkfold.engines.generator import EngineFailure, Outbox, SamplingParams


def writer_and_reader() -> tuple[StepWriter, Connection]:
    ours, theirs = (Connection(s.detach()) for s in socket.socketpair())
    writer = StepWriter(ours, threading.Lock())
    for rid in (1, 2):
        writer.streams[rid] = _Stream(SamplingParams(max_tokens=4), threading.Event())
    return writer, theirs


def test_a_step_of_several_streams_is_one_message_and_an_item_outside_a_step_goes_at_once() -> None:
    writer, server = writer_and_reader()
    assert isinstance(writer, Outbox)  # the same hold-per-step as in one process
    with writer.step():
        writer.emit(1, 10)
        writer.emit(2, 20)
        writer.emit(1, 11)
        writer.emit(2, None)
        assert not server.poll(0)  # held until the step ends
    assert core_wire.recv(server) == core_wire.Step(
        [
            (1, [10, 11], [], writer.streams[1].params.report, None),
            (2, [20], [], SamplingParams(4).report, ("done",)),
        ]
    )
    assert 2 not in writer.streams  # its end went out
    writer.emit(1, EngineFailure("refused"))  # outside a step (an admission refusal): at once
    step = core_wire.recv(server)
    assert isinstance(step, core_wire.Step)
    [(rid, tokens, _, _, end)] = step.streams
    assert (rid, tokens, end[0], str(end[1])) == (1, [], "error", "refused")
    assert not server.poll(0)
