"""Two ranks, one model: the tensor-parallel MLP over torch.distributed's gloo backend.

Each decoder layer's MLP is split across the ranks: ``gate_proj``/``up_proj`` by output rows
(column-parallel), ``down_proj`` by input columns (row-parallel), and one all-reduce sums the two
partial outputs. Attention, norms and embeddings run whole on both ranks.

Rank 0 owns the requests. Before every forward it broadcasts a step (:class:`Op`, cache slot,
token ids) on the gloo group; rank 1 sits in :meth:`Link.follow` and runs the same forward, so its
half of each all-reduce is always there. Rendezvous uses a :class:`~torch.distributed.TCPStore`
listening on rank 0's fabric address only; there the ranks also compare their engine settings and
refuse to start when they differ, naming the fields.
"""

from __future__ import annotations

import datetime
import enum
import json
import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from sparkfold.config import EngineSettings, engine_differences

__all__ = ["EngineMismatch", "Joined", "Link", "Op", "ParallelMLP", "Rendezvous", "meet", "split_mlps"]

log = logging.getLogger(__name__)

WORLD = 2
_INLINE = 16  # token ids carried in the step header itself (decode steps need one broadcast)
_KEY = "sparkfold/engine/{rank}"
_CHECKED = "sparkfold/checked/{rank}"


class EngineMismatch(RuntimeError):
    """The two ranks were started with different ``[engine]`` settings."""


class Op(enum.IntEnum):
    """A step rank 0 tells rank 1 to mirror."""

    NOOP = 0  # keepalive while idle
    OPEN = 1  # a request starts in slot, keeping the first ids[0] tokens of its cache
    FORWARD = 2  # run the model on ids in slot
    CLOSE = 3  # the request in slot is over (its cache is cut back to what a later one may reuse)
    STOP = 4  # rank 0 is shutting down


@dataclass(frozen=True)
class Rendezvous:
    """Where and how the two ranks meet (values from ``[fabric]``)."""

    rank: int
    address: str
    peer: str
    port: int
    timeout_s: float

    @property
    def master(self) -> str:
        return self.address if self.rank == 0 else self.peer


def _listen(address: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((address, port))
    sock.listen(16)
    return sock


def _check_settings(store: dist.TCPStore, rank: int, engine: EngineSettings) -> None:
    mine = engine.model_dump(mode="json")
    store.set(_KEY.format(rank=rank), json.dumps(mine))
    theirs = json.loads(store.get(_KEY.format(rank=1 - rank)))
    store.set(_CHECKED.format(rank=rank), "1")
    # Rank 0 hosts the store: it stays until rank 1 has read, so both ranks see the same verdict.
    store.wait([_CHECKED.format(rank=1 - rank)], datetime.timedelta(seconds=30))
    differing = engine_differences(mine, theirs)
    if differing:
        raise EngineMismatch(
            "engine settings differ between rank 0 and rank 1: "
            + ", ".join(differing)
            + " (make the [engine] sections identical on both nodes)"
        )


def meet(meeting: Rendezvous, engine: EngineSettings) -> Joined:
    """Meet the other rank and compare engine settings (before anything slow is loaded).

    Raises :class:`EngineMismatch` naming the differing fields.
    """
    timeout = datetime.timedelta(seconds=meeting.timeout_s)
    listener = _listen(meeting.address, meeting.port) if meeting.rank == 0 else None
    store = dist.TCPStore(
        meeting.master,
        meeting.port,
        WORLD,
        meeting.rank == 0,
        timeout,
        master_listen_fd=listener.fileno() if listener else None,
    )
    _check_settings(store, meeting.rank, engine)
    return Joined(meeting, store, listener)


@dataclass
class Joined:
    """Two ranks that met and agree on their settings; :meth:`link` builds the gloo group."""

    meeting: Rendezvous
    store: dist.TCPStore
    listener: socket.socket | None

    def link(self) -> Link:
        """Build the gloo group on the fabric addresses; blocks until the other rank calls it too."""
        # torch's stubs do not declare the private _Options; it is the only way to give gloo its devices.
        options = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]
        options._devices = [dist.ProcessGroupGloo.create_device(hostname=self.meeting.address)]
        options._timeout = datetime.timedelta(seconds=self.meeting.timeout_s)
        group = dist.ProcessGroupGloo(self.store, self.meeting.rank, WORLD, options)
        log.info(
            "rank %d linked to rank %d over gloo on %s",
            self.meeting.rank,
            1 - self.meeting.rank,
            self.meeting.address,
        )
        return Link(self.meeting.rank, group, self)


class Link:
    """The gloo group between the ranks: step broadcast and the MLP all-reduce."""

    def __init__(self, rank: int, group: Any, joined: Joined) -> None:
        self.rank = rank
        self._group = group
        self._joined = joined  # keeps the store (and rank 0's listening socket) alive with the group

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        self._group.allreduce([tensor]).wait()
        return tensor

    def send_step(self, op: Op, slot: int = 0, ids: list[int] | tuple[int, ...] = ()) -> None:
        """Rank 0: announce a step (rank 1 mirrors it)."""
        header = torch.zeros(3 + _INLINE, dtype=torch.int64)
        header[0], header[1], header[2] = int(op), slot, len(ids)
        inline = ids[:_INLINE] if len(ids) <= _INLINE else ()
        if inline:
            header[3 : 3 + len(inline)] = torch.tensor(inline, dtype=torch.int64)
        self._group.broadcast(header, 0).wait()
        if len(ids) > _INLINE:
            self._group.broadcast(torch.tensor(ids, dtype=torch.int64), 0).wait()

    def receive_step(self) -> tuple[Op, int, list[int]]:
        """Rank 1: the next step rank 0 announced."""
        header = torch.zeros(3 + _INLINE, dtype=torch.int64)
        self._group.broadcast(header, 0).wait()
        op, slot, count = (int(v) for v in header[:3])
        if count <= _INLINE:
            return Op(op), slot, header[3 : 3 + count].tolist()
        ids = torch.zeros(count, dtype=torch.int64)
        self._group.broadcast(ids, 0).wait()
        return Op(op), slot, ids.tolist()


class ParallelMLP(nn.Module):
    """This rank's half of a gated MLP (``down(act(gate(x)) * up(x))``), summed across ranks."""

    def __init__(self, mlp: Any, rank: int, reduce: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        gate, up, down = mlp.gate_proj, mlp.up_proj, mlp.down_proj
        width = gate.out_features
        if width % WORLD:
            raise ValueError(f"intermediate size {width} does not split over {WORLD} ranks")
        part = slice(rank * width // WORLD, (rank + 1) * width // WORLD)
        self.gate_proj = _rows(gate, part)
        self.up_proj = _rows(up, part)
        self.down_proj = nn.Linear(width // WORLD, down.out_features, bias=False, dtype=down.weight.dtype)
        self.down_proj.weight = nn.Parameter(down.weight[:, part].contiguous(), requires_grad=False)
        self.down_bias = down.bias
        self.act_fn = mlp.act_fn
        self._reduce = reduce

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        partial = self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x)).contiguous()
        out = self._reduce(partial)
        return out + self.down_bias if self.down_bias is not None else out


def _rows(linear: nn.Linear, part: slice) -> nn.Linear:
    weight = linear.weight[part].contiguous()
    out = nn.Linear(weight.shape[1], weight.shape[0], bias=linear.bias is not None, dtype=weight.dtype)
    out.weight = nn.Parameter(weight, requires_grad=False)
    if linear.bias is not None:
        out.bias = nn.Parameter(linear.bias[part].contiguous(), requires_grad=False)
    return out


def split_mlps(model: nn.Module, link: Link) -> int:
    """Replace every decoder layer's MLP with this rank's :class:`ParallelMLP`; returns the count."""
    layers = getattr(model.get_decoder(), "layers", None)  # type: ignore[operator]
    if layers is None:
        raise ValueError("tp = 2 needs a decoder with .layers (Llama-style models)")
    for layer in layers:
        mlp = layer.mlp
        if not all(hasattr(mlp, name) for name in ("gate_proj", "up_proj", "down_proj", "act_fn")):
            raise ValueError(
                f"tp = 2 needs gated MLPs (gate_proj/up_proj/down_proj); got {type(mlp).__name__}"
            )
        layer.mlp = ParallelMLP(mlp, link.rank, link.all_reduce)
    return len(layers)
