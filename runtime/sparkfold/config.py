"""One settings schema for every sparkfold process.

A node has one file, ``/etc/sparkfold/sparkfold.toml``, with these sections:

``[node]``    who this node is (name, rank)
``[fabric]``  the inter-node link: addresses, rendezvous port, peer timeout, RDMA facts
``[engine]``  the engine rank: kind, model, window, parallelism; identical on every rank
``[api]``     the public gateway on the head: bind address, lanes, queue, limits, keys
``[memory]``  the node's memory budget: the reserve kept from the engine, the activation allowance
``[paths]``   where state, models and caches live

Everything is validated by pydantic; unknown keys are errors (a typo never passes silently).
:func:`load` reads and validates a file; :class:`ConfigError` carries one line per problem,
each naming the offending key. :func:`engine_fingerprint` hashes the ``[engine]`` section
that every rank must share; :func:`engine_differences` names the fields that differ.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

__all__ = [
    "DEFAULT_CONFIG_PATH",
    "ApiSettings",
    "ConfigError",
    "EngineSettings",
    "FabricSettings",
    "MediaSettings",
    "MemorySettings",
    "NodeSettings",
    "PathSettings",
    "Settings",
    "SettingsSection",
    "TensorfoldSettings",
    "TransformersSettings",
    "engine_differences",
    "engine_fingerprint",
    "is_loopback",
    "load",
    "parse",
    "parse_as",
    "read_toml",
]

DEFAULT_CONFIG_PATH = Path("/etc/sparkfold/sparkfold.toml")
DEFAULT_RENDEZVOUS_PORT = 29551
DEFAULT_ENGINE_PORT = 18888
DEFAULT_API_PORT = 8888
TENSORFOLD_MAX_PARALLEL = 8
TENSORFOLD_MAX_CONTEXT = 1_048_576
LANES_PER_QUEUE = 4
"""Queued requests per lane when ``api.max_queued`` is left out."""
STALL_S = {"ours": 300.0, "tensorfold": 900.0}
"""``engine.stall_s`` left out: ours see every engine step; TensorFold's token counters stand still
through a prefill, so its limit must be above the longest one (a 1M-token prompt)."""


class ConfigError(ValueError):
    """A settings file that cannot be used; ``problems`` holds one line per offending key."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        super().__init__(f"{source}: " + "; ".join(problems))


_Model = TypeVar("_Model", bound=BaseModel)


class SettingsSection(BaseModel):
    """A table of settings: unknown keys refused, frozen, defaults validated (also the fleet's)."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


class NodeSettings(SettingsSection):
    """Who this node is."""

    name: str = Field("sparkfold", min_length=1, description="node name, used in logs and /health")
    rank: int = Field(0, ge=0, le=1, description="0 = head (engine rank 0 and the API); 1 = worker")


class FabricSettings(SettingsSection):
    """The direct link between the two nodes (the CX7 cable on a Spark pair)."""

    address: ipaddress.IPv4Address | None = Field(None, description="this node's address on the link")
    peer: ipaddress.IPv4Address | None = Field(None, description="the other rank's address on the link")
    rendezvous_port: int = Field(
        DEFAULT_RENDEZVOUS_PORT, ge=1, le=65535, description="rank 0's rendezvous port"
    )
    peer_timeout_s: float = Field(
        120.0, gt=0, le=3600, description="a rank whose peer is silent this long exits non-zero"
    )
    heartbeat_s: float = Field(2.0, gt=0, le=60, description="seconds between peer heartbeats")
    mtu: int = Field(9000, ge=1280, le=9216, description="MTU of the link netdev")
    socket_ifname: str | None = Field(None, description="netdev on the link; discovered when unset")
    rdma_devices: list[str] | None = Field(None, description="RDMA devices for NCCL; discovered when unset")
    gid_index: int | None = Field(None, ge=0, description="RoCE v2 GID index; discovered when unset")

    @model_validator(mode="after")
    def _distinct(self) -> FabricSettings:
        if self.address is not None and self.address == self.peer:
            raise ValueError("fabric.peer must differ from fabric.address")
        return self


class TransformersSettings(SettingsSection):
    """Settings of the CPU engine (``kind = "transformers"``)."""

    gguf_file: str | None = Field(None, description="GGUF file inside `model` to load instead of safetensors")
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="torch dtype of the weights"
    )
    threads: int = Field(0, ge=0, description="torch intra-op threads; 0 = torch's default")
    prefill_chunk_tokens: int = Field(
        256,
        ge=0,
        description="prompt tokens per forward while a prompt is read, interleaved with the other "
        "requests' decode steps; 0 = the whole prompt in one forward",
    )
    prefix_cache_tokens: int = Field(
        8192,
        ge=0,
        description="prompt tokens each lane keeps in its KV cache after a request, so the next request "
        "that starts with the same tokens reads only the rest (reuse resumes at a whole prefill chunk); "
        "0 = off",
    )


class Exllamav3Settings(SettingsSection):
    """Settings of the GPU engine (``kind = "exllamav3"``): exllamav3's generator on local GPUs."""

    reserve_gib: float = Field(
        4.0, ge=0, description="GPU memory left free after the weights and the KV pool (activations, CUDA)"
    )
    pool_tokens: int = Field(
        0, ge=0, description="KV pool size in tokens (multiple of 256); 0 = as many as free memory allows"
    )
    cache: Literal["fp16", "q8", "q6", "q4"] = Field(
        "fp16", description="KV cache: fp16, or exllamav3's quantized cache at 8/6/4 bits per value"
    )
    chunk_tokens: int = Field(2048, ge=256, description="prefill chunk size (multiple of 256)")
    prefill_cooldown: int = Field(
        0,
        ge=0,
        description="while replies stream, prompts that arrive are prefilled one at a time, a pass every "
        "N + 1 steps (exllamav3's prefill_cooldown); 0 with shared_chunk_tokens = 0: every step, all of them",
    )
    shared_chunk_tokens: int = Field(
        0,
        ge=0,
        description="prefill chunk of a prompt that arrives while replies stream (multiple of 256); "
        "0 = chunk_tokens",
    )
    gather_ms: float = Field(
        3.0,
        ge=0,
        le=1000,
        description="an idle engine that receives a request waits until no other arrived for this long "
        "(at most 8 times as long) before its first step, so a burst is prefilled together; 0 = off",
    )
    recurrent_cache_gib: float = Field(
        4.0,
        ge=0,
        description="host memory for recurrent (KDA) state checkpoints: prompt reuse of KDA layers",
    )
    checkpoint_interval: int = Field(
        0, ge=0, description="tokens between recurrent checkpoints (multiple of 256); 0 = the model's default"
    )
    prefill_checkpoint_interval: int = Field(
        0, ge=0, description="tokens between recurrent checkpoints while a prompt is read; 0 = 32768"
    )
    cpu_cache_gib: float = Field(
        0.0, ge=0, description="pinned host memory tier for evicted KV pages; 0 = off"
    )
    disk_cache_dir: Path | None = Field(
        None, description="disk tier for evicted pages and checkpoints (needs cpu_cache_gib > 0); unset = off"
    )
    disk_cache_gib: float = Field(50.0, gt=0, description="budget of disk_cache_dir")
    mtp: bool = Field(False, description="draft with the checkpoint's MTP head")
    drafter: str = Field(
        "none",
        min_length=1,
        description='draft model directory (DFlash2 …), or "none" (the published drafter is non-commercial)',
    )
    ngram: int = Field(0, ge=0, description="n-gram (copy) drafts: minimum match length; 0 = off")
    draft_tokens: int = Field(0, ge=0, description="tokens per draft round; 0 = the drafter's default (4)")
    plain_pool_tokens: int = Field(
        0,
        ge=0,
        description='KV pool of the undrafted lane serving `"draft": false` requests when drafts are on; '
        "0 = one window",
    )
    stop_on_loop: bool = Field(False, description="end a reply that loops (exllamav3's loop guard)")
    warmup: bool = Field(
        True,
        description="run exllamav3's warm-up at start (Triton compiles, GEMM autotuning, the decode "
        "paths' workspaces) so the first requests do not pay them; the start takes longer",
    )

    @model_validator(mode="after")
    def _drafts(self) -> Exllamav3Settings:
        if self.drafter != "none" and not self.drafter.startswith("/"):
            raise ValueError(f'drafter must be "none" or an absolute directory, not {self.drafter!r}')
        if sum([self.mtp, self.drafter != "none", self.ngram > 0]) > 1:
            raise ValueError("choose one draft source: mtp, drafter or ngram")
        for name in (
            "pool_tokens",
            "chunk_tokens",
            "shared_chunk_tokens",
            "checkpoint_interval",
            "prefill_checkpoint_interval",
            "plain_pool_tokens",
        ):
            if getattr(self, name) % 256:
                raise ValueError(f"{name} must be a multiple of 256 (exllamav3's page size)")
        if self.shared_chunk_tokens > self.chunk_tokens:
            raise ValueError("shared_chunk_tokens must not exceed chunk_tokens")
        if self.disk_cache_dir is not None and not self.cpu_cache_gib:
            raise ValueError(
                "disk_cache_dir needs cpu_cache_gib > 0 (the disk tier sits behind the host tier)"
            )
        return self

    @property
    def drafts(self) -> bool:
        return self.mtp or self.drafter != "none" or self.ngram > 0


class MediaSettings(SettingsSection):
    """Pictures in requests to our own engines (``transformers``, ``exllamav3``)."""

    remote_urls: bool = Field(False, description="fetch http(s) image/video URLs; off = data: URLs only")
    max_images: int = Field(8, ge=0, description="images per request")
    max_videos: int = Field(1, ge=0, description="videos per request")
    max_image_mib: float = Field(20, gt=0, description="bytes of one encoded image")
    max_video_mib: float = Field(64, gt=0, description="bytes of one encoded video")
    max_image_tokens: int = Field(
        2048, ge=16, description="tokens one picture may take (larger ones are scaled)"
    )
    max_video_tokens: int = Field(16_384, ge=16, description="tokens one video may take")
    max_total_tokens: int = Field(65_536, ge=16, description="tokens all pictures of a request may take")
    max_image_pixels: int = Field(50_000_000, ge=1, description="pixels of one image (from its header)")
    max_total_pixels: int = Field(
        100_000_000,
        ge=1,
        description="pixels of all images of a request, from their headers, before decoding",
    )
    max_video_frames: int = Field(128, ge=1, description="frames sampled from one video")
    video_fps: float = Field(2.0, gt=0, description="frames per second sampled from a video")


class TensorfoldSettings(SettingsSection):
    """Settings of the production engine (``kind = "tensorfold"``): TensorFold v0.6.0, one rank per node.

    Every value here is part of ``[engine]`` and so of its fingerprint: both ranks must agree.
    """

    launcher: Literal["docker", "host"] = Field(
        "docker", description="run the rank in the engine image (docker) or directly on the host"
    )
    image: str = Field(
        "sparkfold-tensorfold:v0.6.0", min_length=1, description="engine image reference (docker launcher)"
    )
    container_name: str = Field(
        "sparkfold-engine",
        pattern=r"^[a-zA-Z0-9][a-zA-Z0-9_.-]*$",
        description="container name, the same on every node (docker launcher)",
    )
    executable: str = Field(
        "tensorfold", min_length=1, description="the tensorfold command, in the image or on the host"
    )
    drafter: str = Field(
        "none",
        min_length=1,
        description='draft model directory, or "none" (the published DFlash2 drafter is non-commercial)',
    )
    mtp_drafts: int | None = Field(None, ge=0, description="--mtp-drafts N; unset = the family default")
    reasoning_effort: Literal["low", "medium", "high", "xhigh"] | None = Field(
        None, description="--reasoning-effort; unset = the chat template's default"
    )
    thinking_budget: int | None = Field(None, ge=0, description="--thinking-budget N; unset = TensorFold's 0")
    memory_reserve_gib: float | None = Field(
        None, ge=2, description="TENSORFOLD_MEMORY_RESERVE_GIB; unset = max(4 GiB, 10% of RAM)"
    )
    nccl_channels: int = Field(
        4, ge=0, le=64, description="NCCL_MIN_NCHANNELS = NCCL_MAX_NCHANNELS; 0 = NCCL's own choice"
    )
    extra_args: list[str] = Field(
        default_factory=list, description="appended to `tensorfold serve` on every rank (they win)"
    )
    env: dict[str, str] = Field(
        default_factory=dict, description="extra environment of every rank (no secrets: it is in argv)"
    )
    shm_size: str = Field(
        "16g", pattern=r"^[0-9]+[bkmg]?$", description="the container's /dev/shm size (docker launcher)"
    )
    gpus: bool = Field(
        True,
        description="docker run --gpus all, and preflight's GPU and NVIDIA runtime checks; "
        "false only where the rank uses no GPU (the testbed's stand-in)",
    )
    rdma: bool = Field(
        True,
        description="docker run --device /dev/infiniband with locked memory (memlock, IPC_LOCK) for NCCL "
        "over RoCE; false only where the ranks use no RDMA (the testbed's stand-in)",
    )
    kernel_cache_dir: Path | None = Field(
        None, description="compiled kernels, one folder per image; unset = <paths.cache_dir>/tensorfold"
    )
    ready_timeout_s: float = Field(
        1800.0, gt=0, description="a rank not ready this long after start is stopped and fails"
    )
    stop_timeout_s: float = Field(
        30.0, ge=0, description="on stop, SIGTERM then this long before SIGKILL (docker stop -t)"
    )
    probe_every_s: float = Field(
        300.0,
        gt=0,
        description="an idle rank 0 must answer a 1-token request this often to feed the watchdog",
    )
    image_profile: Path | None = Field(
        None,
        description="what the image's patch series supports (written by the image role); "
        "unset = stock TensorFold v0.6.0, no series",
    )
    # --- the reference recipe's engine (its patch series); unset = not passed, the image's default
    kv: Literal["bf16", "fp8"] | None = Field(
        None, description="KV cache rows (TF_GLM_KV); fp8 needs a series"
    )
    dense: Literal["bf16", "fp8", "q4"] | None = Field(
        None, description="BF16 dense weights as q4, fp8 or bf16 (TF_GLM_DENSE)"
    )
    verify_window: int | None = Field(
        None, ge=16, le=64, description="verify-window rows per round, 16-64 step 8 (TF_GLM_MULTI_WINDOW)"
    )
    pool_gib: float | None = Field(
        None, gt=0, description="KV pool cap beyond the window / kept states (TF_GLM_CACHE_GIB)"
    )
    kept_entries: int | None = Field(
        None, ge=1, description="kept prompt states at most (TF_GLM_CACHE_ENTRIES)"
    )
    kept_bytes_gib: float | None = Field(
        None, ge=0, description="byte budget of kept states outside the pool (TF_GLM_KEPT_BYTES_GIB)"
    )
    keep_per_chat: int | None = Field(
        None, ge=0, description="kept turn states per conversation (TF_GLM_KEEP_PER_CHAT); 0 = no quota"
    )
    kept_share_pct: int | None = Field(
        None, ge=0, le=75, description="kept-state count at least this % of the pool (TF_GLM_CACHE_SHARE_PCT)"
    )
    spill_gib: float = Field(
        0, ge=0, description="spill tier for kept states, per node; 0 = off (--spill-gib)"
    )
    spill_dir: Path | None = Field(None, description="spill folder, the same absolute path on every node")
    spill_highwater: float = Field(0.70, gt=0, le=1, description="write early past this pool fraction")
    spill_min_tokens: int = Field(8192, ge=0, description="shorter states are not spilled")
    spill_min_free_gib: float = Field(50, ge=0, description="free-disk floor of the spill folder")
    kv_tier_gib: float = Field(0, ge=0, description="NVMe KV tier cap per node; 0 = off (not with spill_gib)")
    kv_tier_dir: Path | None = Field(None, description="KV tier folder, the same absolute path on every node")
    kv_tier_min_tokens: int = Field(8192, ge=0, description="shorter states are not written to the KV tier")
    kv_tier_min_free_gib: float = Field(50, ge=0, description="free-disk floor of the KV tier folder")
    kv_tier_backlog_gib: float = Field(16, gt=0, description="KV tier write backlog cap")
    display_kv_mib: int = Field(
        0, ge=0, le=2032, description="GB10 display reservation added to the pool (headless only); 0 = off"
    )
    display_kv_backend: Literal["drm", "dispram"] = Field("drm", description="drm, or dispram (kindling)")
    vision: bool = Field(False, description="image and video input (--vision; limits from [engine.media])")
    request_image_tokens: int = Field(16_384, ge=16, description="picture tokens shared by one request")
    request_video_tokens: int = Field(32_768, ge=16, description="clip tokens shared by one request")
    peer_timeout_s: float | None = Field(
        None, ge=0, description="the engine's own lost-peer timeout (TENSORFOLD_PEER_TIMEOUT_S); 0 = never"
    )
    watchdog_s: float | None = Field(
        None, gt=0, description="stuck-step stack dump after this long (TF_GLM_MULTI_WATCHDOG_S)"
    )
    watchdog_exit: bool = Field(False, description="exit 1 on a stuck step (TF_GLM_MULTI_WATCHDOG_EXIT)")
    loop_guard: bool = Field(False, description="close a looping think block (TF_GLM_LOOP_GUARD)")

    @model_validator(mode="before")
    @classmethod
    def _stall_moved(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and "stall_s" in data:
            raise ValueError(
                "stall_s moved to [engine] stall_s (one knob for every engine kind): "
                "write it there, and remove it from [engine.tensorfold]"
            )
        return data

    @model_validator(mode="after")
    def _drafter_and_env(self) -> TensorfoldSettings:
        if self.drafter != "none" and not self.drafter.startswith("/"):
            raise ValueError(f'drafter must be "none" or an absolute directory, not {self.drafter!r}')
        bad = [name for name in self.env if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name)]
        if bad:
            raise ValueError(f"env: not an environment variable name: {', '.join(bad)}")
        return self

    @model_validator(mode="after")
    def _recipe_ranges(self) -> TensorfoldSettings:
        """The recipe's own rules between its knobs (start.sh's checks)."""
        if self.verify_window is not None and self.verify_window % 8:
            raise ValueError(f"verify_window is 16 to 64 in steps of 8, not {self.verify_window}")
        if self.display_kv_mib % 16:
            raise ValueError(f"display_kv_mib is a multiple of 16 (0 to 2032), not {self.display_kv_mib}")
        if self.spill_gib and self.kv_tier_gib:
            raise ValueError(
                "spill_gib and kv_tier_gib are two disk tiers for the same kept prompt states: set one to 0"
            )
        for size, folder in (("spill_gib", "spill_dir"), ("kv_tier_gib", "kv_tier_dir")):
            path = getattr(self, folder)
            if getattr(self, size) and (path is None or not path.is_absolute()):
                raise ValueError(f"{size} > 0 needs {folder}: an absolute folder, the same on every node")
        return self

    @property
    def multi_stream_only(self) -> list[str]:
        """The knobs set here that need more than one stream (engine.parallel > 1)."""
        wanted = {
            "verify_window": self.verify_window is not None,
            "kv_tier_gib": bool(self.kv_tier_gib),
            "display_kv_mib": bool(self.display_kv_mib),
        }
        return [name for name, on in wanted.items() if on]


FORCED_CALLS_PER_TOOL = 8
"""The default of ``[engine] forced_calls_per_tool``."""


class EngineSettings(SettingsSection):
    """The engine rank. Identical on every rank: its fingerprint is compared at rendezvous."""

    kind: Literal["transformers", "exllamav3", "tensorfold"] = Field(
        "transformers", description="engine implementation"
    )
    model: str = Field(..., min_length=1, description="model directory (or file) on this node")
    served_name: str = Field("GLM-5.3-Flash-EXL3", min_length=1, description="model id in /v1/models")
    tp: int = Field(
        1, ge=1, le=2, description="tensor-parallel ranks: 2 = one rank on each node (exllamav3: local GPUs)"
    )
    host: str = Field("127.0.0.1", description="engine server bind address (rank 0): loopback only")
    port: int = Field(DEFAULT_ENGINE_PORT, ge=1, le=65535, description="engine server port (rank 0)")
    context: int = Field(1_048_576, ge=16, description="the window: prompt + reply tokens per request")
    max_tokens: int = Field(32_768, ge=1, description="reply budget when a request sets none")
    parallel: int = Field(4, ge=1, le=64, description="requests the engine runs at once")
    thinking: bool = Field(True, description="thinking on by default")
    forced_calls_per_tool: int = Field(
        FORCED_CALLS_PER_TOOL,
        ge=1,
        le=1024,
        description="a reply whose calls are forced (tool_choice required, parallel calls allowed) "
        "ends after this many calls per offered tool (GLM and chat-template models alike)",
    )
    seed: int = Field(0, ge=0, description="base seed for sampled requests without a seed")
    drain_s: float = Field(30.0, ge=0, description="on SIGTERM, wait this long for in-flight requests")
    stall_s: float = Field(
        STALL_S["ours"],
        gt=0,
        description="work pending this long without progress: unhealthy, the watchdog stops "
        "(unset: 300 s, one engine step; 900 s for tensorfold, its counters stand still in a prefill)",
    )
    core_process: bool = Field(
        False,
        description="run the engine (its model and engine thread) in a child process of its own, "
        "the HTTP side in this one (transformers with tp = 1, or exllamav3); "
        "unset: on for exllamav3 with tp = 1, off otherwise",
    )
    transformers: TransformersSettings = Field(default_factory=TransformersSettings)
    exllamav3: Exllamav3Settings = Field(default_factory=Exllamav3Settings)
    tensorfold: TensorfoldSettings = Field(default_factory=TensorfoldSettings)
    media: MediaSettings = Field(default_factory=MediaSettings)

    @model_validator(mode="before")
    @classmethod
    def _stall_by_kind(cls, data: Any) -> Any:
        """``stall_s`` left out: the engine kind's own default (:data:`STALL_S`)."""
        if isinstance(data, Mapping) and "stall_s" not in data:
            return {**data, "stall_s": STALL_S["tensorfold" if data.get("kind") == "tensorfold" else "ours"]}
        return data

    @model_validator(mode="before")
    @classmethod
    def _core_process_by_kind(cls, data: Any) -> Any:
        """``core_process`` left out: on for exllamav3 with one GPU, off otherwise.

        On the H200 the engine core holds exllamav3's own loop's pace at 1 to 16 streams in runs
        that agree (docs/benchmarks.md); exllamav3 with ``tp = 2`` has not run through it on GPUs,
        and the transformers engine (CPU, development) stays in one process."""
        if isinstance(data, Mapping) and "core_process" not in data:
            one_gpu = data.get("kind") == "exllamav3" and data.get("tp", 1) == 1
            return {**data, "core_process": one_gpu}
        return data

    @model_validator(mode="after")
    def _engine_stays_on_loopback(self) -> EngineSettings:
        # the engine server has no API keys: anyone who reaches it can generate, bypassing the
        # gateway's keys, limits and admission
        if not is_loopback(self.host):
            raise ValueError(
                f"engine.host {self.host} is not loopback, and the engine server has no API keys; "
                "bind it to 127.0.0.1 (the gateway, api.host, is the public side)"
            )
        return self

    @model_validator(mode="after")
    def _reply_fits(self) -> EngineSettings:
        if self.max_tokens > self.context:
            raise ValueError(
                f"engine.max_tokens ({self.max_tokens}) must not exceed engine.context ({self.context})"
            )
        return self

    @model_validator(mode="after")
    def _core_process_fits(self) -> EngineSettings:
        if not self.core_process:
            return self
        if self.kind == "tensorfold":
            raise ValueError(
                "engine.core_process is for our engines; TensorFold runs in its own process already"
            )
        if self.kind == "transformers" and self.tp > 1:
            raise ValueError("engine.core_process needs engine.tp = 1 for the transformers engine")
        return self

    @model_validator(mode="after")
    def _tensorfold_ranges(self) -> EngineSettings:
        """TensorFold's GLM engine: at most 8 streams and the model's 1,048,576-token window."""
        if self.kind != "tensorfold":
            return self
        if self.parallel > TENSORFOLD_MAX_PARALLEL:
            raise ValueError(
                f"engine.parallel is 1 to {TENSORFOLD_MAX_PARALLEL} for tensorfold, not {self.parallel}"
            )
        if self.context > TENSORFOLD_MAX_CONTEXT:
            raise ValueError(
                f"engine.context is at most {TENSORFOLD_MAX_CONTEXT} for tensorfold, not {self.context}"
            )
        needs_more = self.tensorfold.multi_stream_only
        if needs_more and self.parallel == 1:
            raise ValueError(f"engine.tensorfold.{', '.join(needs_more)} needs engine.parallel > 1")
        return self


class ApiSettings(SettingsSection):
    """The public gateway (head only)."""

    host: str = Field("0.0.0.0", description="bind address; keys are required unless it is loopback")
    port: int = Field(DEFAULT_API_PORT, ge=1, le=65535)
    parallel: int = Field(
        4, ge=1, le=256, description="requests sent to the engine at once (lanes); unset = engine.parallel"
    )
    max_queued: int = Field(
        16, ge=0, le=10_000, description="requests waiting for a lane; past that, 429; unset = 4 x lanes"
    )
    keepalive_s: float = Field(
        15.0, gt=0, description="SSE keepalive comment to a client that has received nothing this long"
    )
    send_timeout_s: float = Field(
        30.0,
        gt=0,
        description="a client that has not taken one write this long stopped reading: end its stream",
    )
    api_keys_file: Path | None = Field(None, description="API keys, one per line (plain or sha256:HEX)")
    require_keys: bool | None = Field(None, description="default: required unless host is loopback")
    max_body_mib: float = Field(96, gt=0, description="largest request body")
    max_images: int = Field(8, ge=0, description="images per request")
    max_image_mib: float = Field(20, gt=0, description="bytes of one decoded image")
    max_videos: int = Field(1, ge=0, description="videos per request")
    max_video_mib: float = Field(64, gt=0, description="bytes of one decoded video")
    first_token_timeout_s: float = Field(
        1800.0,
        gt=0,
        description="longest wait for the first token (a 1,048,576-token prefill at ~700 tok/s: ~1500 s)",
    )
    upstream_timeout_s: float = Field(
        600.0, gt=0, description="longest silence tolerated from the engine after the first token"
    )
    max_stored_responses: int = Field(
        1024, ge=1, le=1_000_000, description="finished /v1/responses kept in memory for GET and continuation"
    )
    max_stored_response_mib: float = Field(
        16,
        gt=0,
        description="largest stored response (its JSON with the conversation; media are not kept): "
        "a 1,048,576-token conversation of JSON-escaped non-ASCII text is ~9 MiB",
    )
    max_store_mib: float = Field(256, gt=0, description="all stored responses together; oldest dropped first")
    max_text_body_mib: float = Field(
        32,
        gt=0,
        description="a request body less its data: URLs (text, tools, structure), checked before parsing; "
        "a 1,048,576-token window of JSON-escaped non-ASCII text is ~9 MiB",
    )
    max_json_values: int = Field(
        524_288,
        ge=1024,
        description="objects, arrays and list items of a body outside its strings, before parsing",
    )
    # connection limits (the HTTP server's, before any request is read)
    max_connections: int = Field(
        2048, ge=1, le=1_000_000, description="open client connections; more are refused"
    )
    max_connections_per_client: int = Field(
        512,
        ge=1,
        le=1_000_000,
        description="open connections of one source address (at most 3/4 of max_connections); "
        "at or past max_connections: no per-client cap (behind a reverse proxy)",
    )
    header_timeout_s: float = Field(10.0, gt=0, description="a request's headers must arrive within this")
    idle_timeout_s: float = Field(5.0, gt=0, description="a kept-alive connection idle this long is closed")
    max_header_kib: int = Field(64, ge=1, le=16384, description="request line and headers together")
    max_headers: int = Field(100, ge=1, le=10_000, description="header fields of one request")
    shutdown_grace_s: float = Field(
        5.0, ge=0, description="at shutdown, open streams get an error event; the rest may finish this long"
    )
    cors_allowed_origins: list[str] = Field(
        default_factory=list,
        description='browser origins allowed to call the API (CORS), e.g. "https://app.example"; "*" = any',
    )
    model_aliases: list[Annotated[str, Field(min_length=1, max_length=256)]] = Field(
        default_factory=list,
        max_length=256,
        description='model names answered by engine.served_name: glob patterns, e.g. "claude-*", "gpt-*" '
        "(what coding agents ask for by default); empty = only the served name answers",
    )

    @property
    def keys_required(self) -> bool:
        if self.require_keys is not None:
            return self.require_keys
        return not is_loopback(self.host)


class MemorySettings(SettingsSection):
    """The node's memory budget (:mod:`sparkfold.node.budget`): what the engine may hold is the
    node's usable memory less ``reserve_gib``; ``activation_gib`` is the engine's working memory
    beyond its weights and caches. Not part of the engine fingerprint: a node may differ."""

    reserve_gib: float = Field(
        9.0,
        ge=0,
        description="memory kept from the engine for the OS, the gateway, sshd and the page cache "
        "(GB10: ~9 GiB free held, less preceded engine deaths)",
    )
    activation_gib: float = Field(
        2.0,
        ge=0,
        description="the engine's working memory per rank beyond weights and caches, at 4 requests; "
        "the budget adds 0.95 GiB per request past 4",
    )


class PathSettings(SettingsSection):
    """Where state lives on the node."""

    state_dir: Path = Field(Path("/var/lib/sparkfold"), description="state: models, manifests")
    cache_dir: Path = Field(Path("/var/cache/sparkfold"), description="kernel and compile caches")


class Settings(SettingsSection):
    """A node's whole configuration."""

    node: NodeSettings = Field(default_factory=NodeSettings)
    fabric: FabricSettings = Field(default_factory=FabricSettings)
    engine: EngineSettings
    api: ApiSettings = Field(default_factory=ApiSettings)
    memory: MemorySettings = Field(default_factory=MemorySettings)
    paths: PathSettings = Field(default_factory=PathSettings)

    @model_validator(mode="before")
    @classmethod
    def _lanes_follow_the_engine(cls, data: Any) -> Any:
        """``api.parallel`` left out = the engine's ``parallel``; ``api.max_queued`` = 4 per lane."""
        if not isinstance(data, Mapping):
            return data
        engine, api = data.get("engine"), data.get("api", {})
        if not isinstance(engine, Mapping) or not isinstance(api, Mapping):
            return data
        api = dict(api)
        engine_lanes = engine.get("parallel", EngineSettings.model_fields["parallel"].default)
        lanes = api.setdefault("parallel", engine_lanes)
        if isinstance(lanes, int):
            api.setdefault("max_queued", LANES_PER_QUEUE * lanes)
        return {**data, "api": api}

    @model_validator(mode="after")
    def _topology(self) -> Settings:
        if self.node.rank >= self.engine.tp:
            raise ValueError(f"node.rank ({self.node.rank}) must be below engine.tp ({self.engine.tp})")
        if self.engine.tp > 1 and self.engine.kind != "exllamav3":  # exllamav3: local GPUs, no peer
            for key in ("address", "peer"):
                if getattr(self.fabric, key) is None:
                    raise ValueError(f"fabric.{key} is required when engine.tp > 1")
        if self.node.rank == 0 and self.api.parallel > self.engine.parallel:  # the head runs the gateway
            raise ValueError(
                f"api.parallel ({self.api.parallel}) must not exceed engine.parallel "
                f"({self.engine.parallel}): the gateway's lanes are the engine's; "
                "lower api.parallel or raise engine.parallel"
            )
        return self

    @property
    def engine_url(self) -> str:
        """Where the gateway reaches rank 0's engine server."""
        host = "127.0.0.1" if self.engine.host in ("0.0.0.0", "") else self.engine.host
        return f"http://{host}:{self.engine.port}"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _describe(error: Mapping[str, Any]) -> str:
    location = ".".join(str(part) for part in error["loc"])
    message = str(error["msg"]).removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        return f"{location}: unknown key (check the spelling; see docs/configuration.md)"
    if error["type"] == "missing":
        return f"{location}: required key is missing"
    if not location:
        return message
    return f"{location}: {message}"


def parse(data: Mapping[str, Any], source: str = "<config>") -> Settings:
    """Validate an already-parsed mapping; raise :class:`ConfigError` naming every bad key."""
    return parse_as(Settings, data, source)


def parse_as(schema: type[_Model], data: Mapping[str, Any], source: str = "<config>") -> _Model:
    """Validate ``data`` against any settings ``schema`` (the fleet's file has its own)."""
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(source, [_describe(e) for e in exc.errors()]) from None


def read_toml(path: str | Path) -> dict[str, Any]:
    """A TOML file's mapping, or :class:`ConfigError` saying why it cannot be read."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(str(path), [f"cannot read: {exc.strerror or exc}"]) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(str(path), [f"not valid TOML: {exc}"]) from None


def load(path: str | Path) -> Settings:
    """Read and validate a TOML settings file."""
    return parse(read_toml(path), str(path))


def _engine_fields(settings: Settings | EngineSettings) -> dict[str, Any]:
    engine = settings.engine if isinstance(settings, Settings) else settings
    return engine.model_dump(mode="json")


def engine_fingerprint(settings: Settings | EngineSettings) -> str:
    """sha256 of the canonical JSON of the engine section: equal on every rank of a pair."""
    canonical = json.dumps(_engine_fields(settings), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def engine_differences(
    mine: Mapping[str, Any], theirs: Mapping[str, Any], prefix: str = "engine"
) -> list[str]:
    """Dotted names of the engine fields that differ between two ``model_dump(mode='json')`` dicts."""
    names: list[str] = []
    for key in sorted(set(mine) | set(theirs)):
        a, b = mine.get(key), theirs.get(key)
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            names += engine_differences(a, b, f"{prefix}.{key}")
        elif a != b:
            names.append(f"{prefix}.{key}")
    return names
