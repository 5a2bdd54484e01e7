"""Reasoning controls: every spelling mapped onto GLM's efforts and thinking switch."""

from __future__ import annotations

import pytest
from tests.fakes.harness import Running
from tests.fakes.scripted_engine import ScriptedEngine

from sparkfold.api.errors import InvalidRequest
from sparkfold.api.reasoning import ReasoningControls, reasoning_controls


@pytest.mark.parametrize(
    ("effort", "expected"),
    [
        ("none", (None, False)),
        ("minimal", ("low", None)),
        ("low", ("low", None)),
        ("medium", ("high", None)),
        ("high", ("high", None)),
        ("xhigh", ("max", None)),
        ("max", ("max", None)),
        ("MAX", ("max", None)),
        (None, (None, None)),
    ],
)
def test_effort_names_map_onto_glm(effort: str | None, expected: tuple[str | None, bool | None]) -> None:
    controls = reasoning_controls(reasoning_effort=effort, template_kwargs={})
    assert isinstance(controls, ReasoningControls)
    assert (controls.effort, controls.enable_thinking) == expected


@pytest.mark.parametrize(
    ("kwargs", "thinking", "expected"),
    [
        ({"enable_thinking": False}, None, False),
        ({"thinking": True}, None, True),
        ({"thinking": {"type": "disabled"}}, None, False),
        ({}, {"type": "enabled", "budget_tokens": 100}, True),
        ({"enable_thinking": True, "thinking": False}, None, True),  # the canonical name wins
        ({"thinking": "sometimes"}, None, None),  # logged, not refused
    ],
)
def test_thinking_aliases(kwargs: dict[str, object], thinking: object, expected: bool | None) -> None:
    controls = reasoning_controls(reasoning_effort=None, template_kwargs=kwargs, thinking=thinking)
    assert isinstance(controls, ReasoningControls) and controls.enable_thinking is expected


def test_bad_effort_names_the_field() -> None:
    error = reasoning_controls(reasoning_effort=None, template_kwargs={}, reasoning={"effort": 3})
    assert isinstance(error, InvalidRequest) and error.param == "reasoning.effort"


def test_thinking_off_wins_over_an_effort() -> None:
    controls = reasoning_controls(reasoning_effort="high", template_kwargs={"enable_thinking": False})
    assert isinstance(controls, ReasoningControls) and (controls.effort, controls.enable_thinking) == (
        None,
        False,
    )


def test_engine_receives_the_mapped_controls(gateway: Running, fake: ScriptedEngine) -> None:
    base = {"model": "fake", "messages": [{"role": "user", "content": "x"}]}
    gateway.http.post("/v1/chat/completions", json={**base, "reasoning_effort": "medium"})
    assert fake.requests[-1]["reasoning_effort"] == "high"
    gateway.http.post("/v1/chat/completions", json={**base, "reasoning_effort": "none"})
    assert fake.requests[-1]["chat_template_kwargs"] == {"enable_thinking": False}
    assert "reasoning_effort" not in fake.requests[-1]
    gateway.http.post("/v1/chat/completions", json={**base, "chat_template_kwargs": {"thinking": False}})
    assert fake.requests[-1]["chat_template_kwargs"] == {"enable_thinking": False}
