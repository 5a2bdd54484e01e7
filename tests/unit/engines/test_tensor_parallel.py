"""The tensor-parallel pieces without a second host: MLP split, step protocol, settings check."""

from __future__ import annotations

import socket
import threading
from typing import Any

import pytest
import torch
from torch import nn

from sparkfold.config import EngineSettings
from sparkfold.engines.transformers.tensor_parallel import EngineMismatch, Op, ParallelMLP, Rendezvous, meet


class GatedMLP(nn.Module):
    def __init__(self, hidden: int = 8, width: int = 12) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, width, bias=False)
        self.up_proj = nn.Linear(hidden, width, bias=False)
        self.down_proj = nn.Linear(width, hidden, bias=False)
        self.act_fn = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


def test_the_two_halves_sum_to_the_whole_mlp() -> None:
    torch.manual_seed(0)
    mlp, x = GatedMLP(), torch.randn(3, 8)
    partials: list[torch.Tensor] = []
    halves = [ParallelMLP(mlp, rank, lambda t: partials.append(t.clone()) or t) for rank in (0, 1)]
    with torch.inference_mode():
        for half in halves:
            half(x)
        assert torch.allclose(partials[0] + partials[1], mlp(x), atol=1e-6)
    assert halves[0].gate_proj.out_features == 6 and halves[1].down_proj.in_features == 6


def test_an_mlp_that_does_not_split_evenly_is_refused() -> None:
    with pytest.raises(ValueError, match="does not split"):
        ParallelMLP(GatedMLP(width=7), 0, lambda t: t)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _both_ranks(engines: tuple[EngineSettings, EngineSettings], work: Any) -> list[Any]:
    """Run ``work(rank, joined)`` for both ranks in threads over loopback; results or exceptions."""
    port = _free_port()
    results: list[Any] = [None, None]

    def rank_main(rank: int) -> None:
        me, peer = ("127.0.0.1", "127.0.0.2") if rank == 0 else ("127.0.0.2", "127.0.0.1")
        try:
            joined = meet(Rendezvous(rank, me, peer, port, timeout_s=30), engines[rank])
            results[rank] = work(rank, joined)
        except Exception as exc:
            results[rank] = exc

    threads = [threading.Thread(target=rank_main, args=(rank,)) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return results


def test_different_engine_settings_are_refused_on_both_ranks_naming_the_fields() -> None:
    a = EngineSettings(model="m", context=4096, max_tokens=64)
    b = EngineSettings(model="m", context=2048, max_tokens=64, transformers={"threads": 2})
    results = _both_ranks((a, b), lambda rank, joined: "met")
    for result in results:
        assert isinstance(result, EngineMismatch)
        assert "engine.context, engine.transformers.threads" in str(result)


def test_rank1_receives_the_steps_rank0_sends_and_all_reduce_sums() -> None:
    settings = EngineSettings(model="m", context=4096, max_tokens=64)
    steps = [(Op.OPEN, 3, []), (Op.FORWARD, 3, list(range(40))), (Op.FORWARD, 3, [7]), (Op.STOP, 0, [])]

    def work(rank: int, joined: Any) -> Any:
        link = joined.link()
        total = link.all_reduce(torch.full((4,), float(rank + 1)))
        if rank == 0:
            for op, slot, ids in steps:
                link.send_step(op, slot, ids)
            return total
        return total, [link.receive_step() for _ in steps]

    sent, (summed, received) = _both_ranks((settings, settings), work)
    assert torch.equal(sent, torch.full((4,), 3.0)) and torch.equal(summed, sent)
    assert received == steps


def test_rank1_keeps_what_rank0_reuses() -> None:
    """A prompt reused from a lane on two ranks gives the logits of the same prompt read cold: rank 1
    cut its own lane back as rank 0 did (a longer cache there would change its half of every MLP)."""
    import copy

    from transformers import LlamaConfig, LlamaForCausalLM

    from sparkfold.engines.transformers.backend import ModelRunner
    from sparkfold.engines.transformers.tensor_parallel import split_mlps

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4
    )
    models = [LlamaForCausalLM(config).eval(), None]
    models[1] = copy.deepcopy(models[0])
    settings = EngineSettings(model="m", context=4096, max_tokens=64)
    first, second = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [1, 2, 3, 4, 5, 6, 7, 8, 11, 12]

    def read(runner: ModelRunner, slot: int, prompt: list[int], start: int) -> torch.Tensor:
        for at in range(start, len(prompt), 4):
            logits = runner.forward(slot, prompt[at : at + 4])
        return logits

    def work(rank: int, joined: Any) -> Any:
        link = joined.link()
        split_mlps(models[rank], link)
        runner = ModelRunner(models[rank], link, block=4, keep_tokens=64)
        if rank == 1:
            return runner.follow()
        runner.open(0)
        read(runner, 0, first, 0)
        runner.close(0)
        keep = runner.reusable(0, second)
        runner.open(0, keep)
        reused = read(runner, 0, second, keep)
        runner.open(1)
        cold = read(runner, 1, second, 0)
        runner.stop()
        return keep, reused, cold

    (keep, reused, cold), followed = _both_ranks((settings, settings), work)
    assert followed is None and keep == 8
    assert torch.equal(reused, cold)
