"""One TensorFold v0.6.0 rank as values: its command, environment and launcher argv.

Everything here is a pure function of the node's :class:`~sparkfold.config.Settings` and of the
link's :class:`FabricFacts` (discovered by ``sparkfold.node`` or written out in ``[fabric]``, and
handed over as values: engines never import ``node/``). Nothing is started here; the process
side is :mod:`sparkfold.engines.tensorfold.process`.

The shape follows TensorFold's two-rank recipe: the same ``tensorfold serve MODEL --tp 2 --rank R
--master <rank 0's link address> --master-port P`` plus the shared serve arguments on both
ranks (the ranks compare their settings at rendezvous and refuse to start when they differ);
rank 0 alone adds ``--name``, ``--host`` and ``--port`` (rank 1 has no HTTP port). Readiness:
rank 1 prints ``[tensorfold] rank 1 ready in X s, following rank 0``; rank 0 is ready when
``GET /health`` answers ``"ok": true`` (its port opens only once both ranks have loaded).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparkfold.config import FabricSettings, Settings
from sparkfold.image.patches import LABEL

__all__ = [
    "CONTAINER_CACHE",
    "DOCKER",
    "FabricFacts",
    "LaunchError",
    "LaunchPlan",
    "ServingLine",
    "docker_argv",
    "docker_remove_argv",
    "docker_stop_argv",
    "follower_ready_s",
    "health_is_ready",
    "host_argv",
    "image_label_argv",
    "kernel_cache_dir",
    "launch_plan",
    "master_address",
    "progress_note",
    "rank_command",
    "rank_environment",
    "recipe_environment",
    "serving_line",
]

DOCKER = "docker"
CONTAINER_CACHE = Path("/cache")
"""Where the host's kernel cache folder is mounted inside the engine container."""

CONTAINER_SPILL = Path("/spill")
"""Where the spill tier's host folder is mounted inside the engine container (the recipe's path)."""
DRM_CARD = "/dev/dri/card0"
"""The display device the recipe's ``drm`` display-memory backend needs."""
DISPRAM_SOCKET = Path("/run/dispram")
"""The ``dispram`` backend's daemon socket folder (kindling spark-os), mounted at the same path."""
DISPRAM_CLIENT = Path("/opt/kindling/dispram/python")
"""dispramd's python client on the host; the rank imports it from :data:`CONTAINER_DISPRAM`."""
CONTAINER_DISPRAM = Path("/opt/dispram")
"""Where the client is mounted (read-only) and put on ``PYTHONPATH`` in the container (the recipe's
start.sh at 05f75fdec1dec6ec8ab7b618c849a5bd8843221a)."""

STACK_BYTES = 67_108_864
"""``--ulimit stack``: 64 MiB, as TensorFold's two-node deployments run it."""

_FOLLOWER_READY = re.compile(r"\[tensorfold\] rank (\d+) ready in ([0-9.]+) s, following rank 0")
_SERVING = re.compile(
    r"\[tensorfold\] serving (?P<name>\S+) at (?P<url>https?://\S+?)/v1 on (?P<backend>\S+), "
    r"rank 0 of (?P<world>\d+)"
)
_PROGRESS = (
    (re.compile(r"building CUDA extension (\S+)"), "compiling CUDA kernels ({0}); the first start is slow"),
    (
        re.compile(r"rank (\d+) finished loading; waiting for rank (\d+)"),
        "rank {0} loaded, waiting for rank {1}",
    ),
    (re.compile(r"startup estimate ([0-9.]+) GiB"), "startup memory estimate {0} GiB"),
)


class LaunchError(ValueError):
    """The settings cannot make a TensorFold rank; the message names the key to change."""


@dataclass(frozen=True)
class FabricFacts:
    """What NCCL needs to know about the link on this node.

    ``netdev`` is the interface that routes to the peer's link address, ``rdma_devices`` its RoCE
    device followed by any further rail (the PCIe twin), ``gid_index`` the RoCE v2 GID index that
    holds this node's IPv4 address (the same index on every rail).
    """

    netdev: str
    rdma_devices: tuple[str, ...]
    gid_index: int

    def __post_init__(self) -> None:
        if not self.netdev or not self.rdma_devices or self.gid_index < 0:
            raise LaunchError(f"incomplete fabric facts: {self!r}")

    @property
    def rails(self) -> int:
        """How many RoCE devices NCCL stripes over."""
        return len(self.rdma_devices)

    @classmethod
    def from_settings(cls, fabric: FabricSettings) -> FabricFacts | None:
        """The facts written out in ``[fabric]``; None when any of them is left to discovery."""
        if fabric.socket_ifname is None or not fabric.rdma_devices or fabric.gid_index is None:
            return None
        return cls(fabric.socket_ifname, tuple(fabric.rdma_devices), fabric.gid_index)


@dataclass(frozen=True)
class LaunchPlan:
    """How to run one rank: exactly what ``sparkfold engine --dry-run`` prints.

    ``argv`` is executed with the supervisor's environment plus ``env`` (empty for the docker
    launcher, whose rank environment travels as ``-e`` arguments). ``command`` and ``rank_env``
    are the rank's own command and environment, inside the container for the docker launcher.
    """

    rank: int
    launcher: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    command: tuple[str, ...]
    rank_env: Mapping[str, str]
    container: str | None
    health_url: str | None
    directories: tuple[Path, ...] = field(default=())
    ready_timeout_s: float = 1800.0
    stop_timeout_s: float = 30.0

    def as_text(self) -> str:
        """The plan for people (``--dry-run``): the command line, ready to paste, and the environment."""
        where = "in the container" if self.launcher == "docker" else "added to the supervisor's"
        lines = [
            f"# rank {self.rank}, {self.launcher} launcher",
            shlex.join(self.argv),
            f"# environment ({where})",
        ]
        lines += [f"{name}={value}" for name, value in sorted(self.rank_env.items())]
        return "\n".join(lines) + "\n"

    def as_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "launcher": self.launcher,
            "argv": list(self.argv),
            "env": dict(self.env),
            "command": list(self.command),
            "rank_env": dict(self.rank_env),
            "container": self.container,
            "health_url": self.health_url,
        }


@dataclass(frozen=True)
class ServingLine:
    """Rank 0's ``[tensorfold] serving NAME at URL/v1 on BACKEND, rank 0 of N (...)`` line."""

    name: str
    url: str
    backend: str
    world: int


def master_address(settings: Settings) -> str:
    """Rank 0's address on the link: this node's own on the head, the peer's on the worker."""
    fabric = settings.fabric
    address = fabric.address if settings.node.rank == 0 else fabric.peer
    if address is None:
        key = "fabric.address" if settings.node.rank == 0 else "fabric.peer"
        raise LaunchError(f"{key} is required: rank 0's link address is TensorFold's --master")
    return str(address)


def _check(settings: Settings) -> None:
    if settings.engine.kind != "tensorfold":
        raise LaunchError(f'engine.kind is "{settings.engine.kind}", not "tensorfold"')
    if not settings.engine.model.startswith("/"):
        raise LaunchError(
            f"engine.model must be an absolute directory for TensorFold: {settings.engine.model}"
        )


def rank_command(settings: Settings) -> list[str]:
    """``tensorfold serve MODEL …`` for this node's rank; the same on the host and in the image."""
    _check(settings)
    engine, tf = settings.engine, settings.engine.tensorfold
    rank = settings.node.rank
    command = [tf.executable, "serve", engine.model]
    if engine.tp > 1:
        command += ["--tp", str(engine.tp), "--rank", str(rank), "--master", master_address(settings)]
        command += ["--master-port", str(settings.fabric.rendezvous_port)]
    command += ["--drafter", tf.drafter]
    command += ["--context", str(engine.context), "--parallel", str(engine.parallel)]
    command += ["--max-tokens", str(engine.max_tokens)]
    command.append("--thinking" if engine.thinking else "--no-thinking")
    if tf.reasoning_effort is not None:
        command += ["--reasoning-effort", tf.reasoning_effort]
    if tf.thinking_budget is not None:
        command += ["--thinking-budget", str(tf.thinking_budget)]
    if tf.mtp_drafts is not None:
        command += ["--mtp-drafts", str(tf.mtp_drafts)]
    if tf.vision:
        command.append("--vision")
        if engine.media.remote_urls:
            command.append("--vision-urls")
    if tf.spill_gib:
        command += ["--spill-gib", f"{tf.spill_gib:g}", "--snapshot-dir", str(_spill_dir(settings))]
        command += [
            "--spill-highwater",
            f"{tf.spill_highwater:g}",
            "--spill-min-tokens",
            str(tf.spill_min_tokens),
        ]
        command += ["--spill-min-free-gib", f"{tf.spill_min_free_gib:g}"]
    if rank == 0:
        command += ["--name", engine.served_name, "--host", engine.host, "--port", str(engine.port)]
    return command + list(tf.extra_args)


def _spill_dir(settings: Settings) -> Path:
    """The spill folder as the rank sees it: mounted at /spill in the container (the recipe's form)."""
    tf = settings.engine.tensorfold
    assert tf.spill_dir is not None  # checked by the schema when spill_gib > 0
    return CONTAINER_SPILL if tf.launcher == "docker" else tf.spill_dir


def _text(value: float | None) -> str | None:
    """A knob's value as the recipe's shell would write it (``12.5``, ``32``); None stays unset."""
    if value is None:
        return None
    return str(value) if isinstance(value, int) else f"{value:g}"


def recipe_environment(settings: Settings) -> dict[str, str]:
    """The variables the reference recipe's ranks read, for the ``[engine.tensorfold]`` knobs set.

    A knob left unset is not passed (the image's own default holds); a group (KV tier, display
    memory, vision) is passed only when it is on. The names are the recipe's own, each checked
    against its source (docs/configuration.md cites file and commit). Which image can honour which
    knob is :mod:`sparkfold.engines.tensorfold.profile`'s business; this only renders.
    """
    tf, media = settings.engine.tensorfold, settings.engine.media
    always: dict[str, str | None] = {
        "TF_GLM_KV": tf.kv,
        "TF_GLM_DENSE": tf.dense,
        "TF_GLM_MULTI_WINDOW": _text(tf.verify_window),
        "TF_GLM_CACHE_GIB": _text(tf.pool_gib),
        "TF_GLM_CACHE_ENTRIES": _text(tf.kept_entries),
        "TF_GLM_KEPT_BYTES_GIB": _text(tf.kept_bytes_gib),
        "TF_GLM_KEEP_PER_CHAT": _text(tf.keep_per_chat),
        "TF_GLM_CACHE_SHARE_PCT": _text(tf.kept_share_pct),
        "TENSORFOLD_PEER_TIMEOUT_S": _text(tf.peer_timeout_s),
        "TF_GLM_MULTI_WATCHDOG_S": _text(tf.watchdog_s),
        "TF_GLM_MULTI_WATCHDOG_EXIT": "1" if tf.watchdog_exit else None,
        "TF_GLM_LOOP_GUARD": "1" if tf.loop_guard else None,
    }
    kv_tier = {
        "TF_GLM_KV_TIER": str(tf.kv_tier_dir),
        "TF_GLM_KV_TIER_GIB": _text(tf.kv_tier_gib),
        "TF_GLM_KV_TIER_MIN": _text(tf.kv_tier_min_tokens),
        "TF_GLM_KV_TIER_MIN_FREE_GIB": _text(tf.kv_tier_min_free_gib),
        "TF_GLM_KV_TIER_BACKLOG_GIB": _text(tf.kv_tier_backlog_gib),
    }
    display = {
        "TF_GLM_DISPLAY_KV_MIB": _text(tf.display_kv_mib),
        "TF_GLM_DISPLAY_KV_BACKEND": tf.display_kv_backend,
    }
    if tf.display_kv_backend == "dispram":
        display["PYTHONPATH"] = str(CONTAINER_DISPRAM if tf.launcher == "docker" else DISPRAM_CLIENT)
    vision = {
        "TENSORFOLD_GLM_MAX_IMAGES": _text(media.max_images),
        "TENSORFOLD_GLM_MAX_VIDEOS": _text(media.max_videos),
        "TENSORFOLD_GLM_IMAGE_TOKENS": _text(media.max_image_tokens),
        "TENSORFOLD_GLM_VIDEO_TOKENS": _text(media.max_video_tokens),
        "TENSORFOLD_GLM_VIDEO_FRAMES": _text(media.max_video_frames),
        "TENSORFOLD_GLM_REQUEST_IMAGE_TOKENS": _text(tf.request_image_tokens),
        "TENSORFOLD_GLM_REQUEST_VIDEO_TOKENS": _text(tf.request_video_tokens),
    }
    groups = [
        (True, always),
        (bool(tf.kv_tier_gib), kv_tier),
        (bool(tf.display_kv_mib), display),
        (tf.vision, vision),
    ]
    return {name: value for on, group in groups if on for name, value in group.items() if value is not None}


def kernel_cache_dir(settings: Settings, image_key: str | None = None) -> Path:
    """The host folder of compiled kernels for this image (another image's kernels never load).

    ``image_key`` is the image's series hash label when the caller knows it; otherwise the image
    reference, made safe as a folder name. The host launcher uses the folder ``host``.
    """
    tf = settings.engine.tensorfold
    root = tf.kernel_cache_dir or settings.paths.cache_dir / "tensorfold"
    if tf.launcher == "host":
        return root / "host"
    key = image_key or tf.image
    return root / re.sub(r"[^A-Za-z0-9_.-]+", "_", key).strip("._")


def rank_environment(settings: Settings, facts: FabricFacts | None, cache_root: Path) -> dict[str, str]:
    """The rank's environment: offline, no update check, kernel caches, NCCL over the RoCE link.

    ``cache_root`` is the kernel cache as the rank sees it (``/cache`` in the container).
    ``[engine.tensorfold] env`` comes last and wins.
    """
    _check(settings)
    tf = settings.engine.tensorfold
    env = {
        "HF_HUB_OFFLINE": "1",
        "TENSORFOLD_NO_UPDATE_CHECK": "1",
        "PYTHONUNBUFFERED": "1",
        "TORCH_EXTENSIONS_DIR": str(cache_root / "torch_extensions"),
        "TRITON_CACHE_DIR": str(cache_root / "triton"),
        "XDG_CACHE_HOME": str(cache_root / "xdg"),
    }
    if tf.memory_reserve_gib is not None:
        env["TENSORFOLD_MEMORY_RESERVE_GIB"] = f"{tf.memory_reserve_gib:g}"
    if settings.engine.tp > 1:
        if facts is None:
            raise LaunchError(
                "fabric facts are missing: set [fabric] socket_ifname, rdma_devices and gid_index, "
                "or let `sparkfold fabric` discover them"
            )
        env |= {
            "NCCL_SOCKET_IFNAME": facts.netdev,
            # "=" makes NCCL match the device names exactly rather than as prefixes
            "NCCL_IB_HCA": "=" + ",".join(facts.rdma_devices),
            "NCCL_IB_GID_INDEX": str(facts.gid_index),
            "NCCL_IB_ROCE_VERSION_NUM": "2",
            "NCCL_IB_ADDR_FAMILY": "AF_INET",
        }
        if tf.nccl_channels:
            env["NCCL_MIN_NCHANNELS"] = env["NCCL_MAX_NCHANNELS"] = str(tf.nccl_channels)
    return env | recipe_environment(settings) | dict(tf.env)


def _read_only_mounts(settings: Settings) -> list[tuple[Path, Path]]:
    """(host, container) folders the rank reads: the model and drafter (at their own paths), the
    dispram client."""
    tf = settings.engine.tensorfold
    mounts = [(Path(settings.engine.model), Path(settings.engine.model))]
    if tf.drafter != "none":
        mounts.append((Path(tf.drafter), Path(tf.drafter)))
    if tf.display_kv_mib and tf.display_kv_backend == "dispram":
        mounts.append((DISPRAM_CLIENT, CONTAINER_DISPRAM))
    return mounts


def _writable_mounts(settings: Settings) -> list[tuple[Path, Path]]:
    """(host, container) folders the rank writes: the disk tiers, the dispram daemon's socket."""
    tf = settings.engine.tensorfold
    mounts = []
    if tf.display_kv_mib and tf.display_kv_backend == "dispram":
        mounts.append((DISPRAM_SOCKET, DISPRAM_SOCKET))
    if tf.spill_gib and tf.spill_dir is not None:
        mounts.append((tf.spill_dir, CONTAINER_SPILL))
    if tf.kv_tier_gib and tf.kv_tier_dir is not None:
        mounts.append((tf.kv_tier_dir, tf.kv_tier_dir))
    return mounts


def docker_argv(
    settings: Settings,
    facts: FabricFacts | None,
    *,
    image_key: str | None = None,
    memory_bytes: int | None = None,
) -> list[str]:
    """``docker run …`` for this rank: host network and IPC, GPUs, RDMA devices, locked memory.

    The rank is the one this node gives up under memory pressure: ``--oom-score-adj 1000`` makes it
    the first choice of the memory guard and of the kernel; ``memory_bytes`` (the node's memory
    budget, usable memory less the reserve) caps what its host side may hold (``--memory``).

    GPUs and the RDMA devices with locked memory are what a real pair needs
    (``engine.tensorfold.gpus`` / ``rdma``, both on by default); the testbed's stand-in turns them off.

    The model (and a drafter directory) are mounted read-only at the same path, so the command is
    the same as on the host; the kernel cache is mounted at ``/cache``. ``--init`` forwards
    ``docker stop``'s SIGTERM to the rank (a Python PID 1 would ignore it); ``--pull never``
    fails at once on a missing image instead of reaching for a registry.
    """
    tf = settings.engine.tensorfold
    argv = [DOCKER, "run", "--rm", "--init", "--pull", "never", "--name", tf.container_name]
    argv += ["--network", "host", "--ipc", "host"]
    argv += ["--gpus", "all"] if tf.gpus else []
    argv += ["--device", "/dev/infiniband"] if tf.rdma else []
    argv += ["--ulimit", "memlock=-1"] if tf.rdma else []
    argv += ["--ulimit", f"stack={STACK_BYTES}"]
    argv += ["--cap-add", "IPC_LOCK"] if tf.rdma else []
    argv += ["--shm-size", tf.shm_size, "--oom-score-adj", "1000"]
    argv += ["--memory", str(memory_bytes)] if memory_bytes else []
    if tf.display_kv_mib and tf.display_kv_backend == "drm":
        argv += ["--device", DRM_CARD]
    for host, inside in _read_only_mounts(settings):
        argv += ["-v", f"{host}:{inside}:ro"]
    for host, inside in _writable_mounts(settings):
        argv += ["-v", f"{host}:{inside}"]
    argv += ["-v", f"{kernel_cache_dir(settings, image_key)}:{CONTAINER_CACHE}"]
    for name, value in sorted(rank_environment(settings, facts, CONTAINER_CACHE).items()):
        argv += ["-e", f"{name}={value}"]
    return [*argv, tf.image, *rank_command(settings)]


def host_argv(settings: Settings) -> list[str]:
    """The host launcher runs the rank's command itself (``tensorfold`` installed on the host)."""
    return rank_command(settings)


def docker_stop_argv(settings: Settings, timeout_s: float | None = None) -> list[str]:
    tf = settings.engine.tensorfold
    seconds = tf.stop_timeout_s if timeout_s is None else timeout_s
    return [DOCKER, "stop", "-t", str(round(seconds)), tf.container_name]


def docker_remove_argv(settings: Settings) -> list[str]:
    """Removes a leftover container of the same name (a crashed supervisor's) before a start."""
    return [DOCKER, "rm", "-f", settings.engine.tensorfold.container_name]


def image_label_argv(settings: Settings) -> list[str]:
    """Reads the image's series hash label (:data:`sparkfold.image.patches.LABEL`), then the
    reference recipe's ``tf.patches`` (a published recipe image carries only that one)."""
    template = "{{index .Config.Labels " + f'"{LABEL}"' + '}} {{index .Config.Labels "tf.patches"}}'
    return [DOCKER, "image", "inspect", "--format", template, settings.engine.tensorfold.image]


def _health_url(settings: Settings) -> str | None:
    if settings.node.rank != 0:
        return None
    return f"{settings.engine_url}/health"


def launch_plan(
    settings: Settings,
    facts: FabricFacts | None,
    *,
    image_key: str | None = None,
    memory_bytes: int | None = None,
) -> LaunchPlan:
    """Everything needed to run, watch and stop this node's rank (``memory_bytes``: :func:`docker_argv`)."""
    tf = settings.engine.tensorfold
    cache = kernel_cache_dir(settings, image_key)
    if tf.launcher == "docker":
        argv = docker_argv(settings, facts, image_key=image_key, memory_bytes=memory_bytes)
        rank_env = rank_environment(settings, facts, CONTAINER_CACHE)
        env: dict[str, str] = {}
        container: str | None = tf.container_name
    else:
        argv = host_argv(settings)
        rank_env = env = rank_environment(settings, facts, cache)
        container = None
    return LaunchPlan(
        rank=settings.node.rank,
        launcher=tf.launcher,
        argv=tuple(argv),
        env=env,
        command=tuple(rank_command(settings)),
        rank_env=rank_env,
        container=container,
        health_url=_health_url(settings),
        directories=(cache,),
        ready_timeout_s=tf.ready_timeout_s,
        stop_timeout_s=tf.stop_timeout_s,
    )


# --- readiness and progress, read from the rank's output and /health --------------------------


def follower_ready_s(line: str) -> float | None:
    """Seconds from rank 1's ``[tensorfold] rank 1 ready in X s, following rank 0``; else None."""
    match = _FOLLOWER_READY.search(line)
    return float(match.group(2)) if match else None


def serving_line(line: str) -> ServingLine | None:
    """Rank 0's serving line (it binds its port right after printing it); else None."""
    match = _SERVING.search(line)
    if match is None:
        return None
    return ServingLine(match["name"], match["url"], match["backend"], int(match["world"]))


def health_is_ready(body: Any) -> bool:
    """Rank 0 is ready when ``GET /health`` answers a JSON object with ``"ok": true``."""
    return isinstance(body, dict) and body.get("ok") is True


def progress_note(line: str) -> str | None:
    """A short progress note for the lines that say where a slow start stands; else None."""
    for pattern, note in _PROGRESS:
        match = pattern.search(line)
        if match:
            return note.format(*match.groups())
    return None
