"""What a TensorFold engine image can honour, and the ``[engine.tensorfold]`` settings it cannot.

An image declares what its patch series supports in a small TOML file, its *profile*, written
beside the series and installed on every node by the image role (docs/patches.md)::

    image = "sparkfold-tensorfold:v0.6.0 (TensorFold v0.6.0 + the reference recipe's series @ 0123abc…)"
    supports = ["parallel", "kv_fp8", "dense", "kept_state", "spill", "kv_tier", "display_kv",
                "vision", "peer_watch", "watchdog", "loop_guard"]

:func:`refusals` names every setting the image cannot honour, each with the image's name and what
to change, and applies the recipe's engine rules that depend on what the image does (``parallel >
1`` needs the DFlash2 drafter; the window that fits a KV cache format). ``sparkfold config check``
and the rank supervisor refuse such settings before anything starts: a setting is never dropped.
No ``image_profile`` means stock TensorFold v0.6.0, which supports none of the features.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sparkfold.config import EngineSettings, Settings

__all__ = [
    "FEATURES",
    "STOCK",
    "ImageProfile",
    "ProfileError",
    "load_profile",
    "profile_of",
    "refusal",
    "refusals",
]

FEATURES: dict[str, str] = {
    "parallel": "several requests at once over one KV pool (patches 0026-0030, 0069)",
    "kv_fp8": "an FP8 KV cache (patch 0038)",
    "dense": "re-quantized dense weights, q4 or fp8 (patches 0002, 0005)",
    "kept_state": "kept-state byte budgets and quotas (patches 0089, 0097)",
    "spill": "the spill tier for kept states (patch 0088)",
    "kv_tier": "the NVMe KV tier (patch 0109)",
    "display_kv": "the GB10 display reservation in the pool (patches 0072, 0087)",
    "vision": "images and video on CUDA GLM (patches 0003, 0050, 0056, 0080)",
    "peer_watch": "the engine's own peer watch (patch 0115)",
    "watchdog": "the stuck-step watchdog (TF_GLM_MULTI_WATCHDOG_S)",
    "loop_guard": "the think-loop guard (patch 0091)",
}
"""Features a series may provide, and where the reference recipe's series provides them."""

BF16_WINDOWS: dict[str, int] = {
    "several": 196_608,  # several requests, DFlash2 drafts (the recipe's default)
    "single": 524_288,  # one request, MTP drafts
    "vision": 163_840,  # several requests with vision on and fp8 or bf16 dense weights
}
"""The windows a bf16 KV cache fits on two Sparks (the recipe's scripts/config.sh, CONTEXT)."""


class ProfileError(ValueError):
    """The profile file cannot be read; the message says which file and why."""


@dataclass(frozen=True)
class ImageProfile:
    image: str
    supports: frozenset[str]
    path: Path | None = None

    def __str__(self) -> str:
        where = f", profile {self.path}" if self.path else ""
        return f'image "{self.image}"{where}'


STOCK = ImageProfile("stock TensorFold v0.6.0 (no image_profile: no patch series)", frozenset())


def load_profile(path: str | Path) -> ImageProfile:
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ProfileError(
            f"cannot read the image profile {path}: {exc.strerror or exc} "
            "(the image stage writes it; or set engine.tensorfold.image_profile)"
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"the image profile {path} is not valid TOML: {exc}") from None
    image, supports = data.get("image"), data.get("supports", [])
    if not isinstance(image, str) or not image:
        raise ProfileError(f"the image profile {path}: `image` must name the image")
    if not isinstance(supports, list) or not all(isinstance(item, str) for item in supports):
        raise ProfileError(f"the image profile {path}: `supports` must be a list of feature names")
    unknown = sorted(set(supports) - set(FEATURES))
    if unknown:
        raise ProfileError(
            f"the image profile {path} names unknown features {unknown}; known: {', '.join(FEATURES)}"
        )
    return ImageProfile(image, frozenset(supports), path)


def profile_of(settings: Settings, override: str | Path | None = None) -> ImageProfile:
    """The profile of the image these settings run: ``override``, the configured file, or stock."""
    path = override or settings.engine.tensorfold.image_profile
    return STOCK if path is None else load_profile(path)


Check = Callable[[EngineSettings], str | None]
"""Returns the setting (``key = value``) that needs a feature, or None when it needs none."""

_NEEDS: tuple[tuple[str, Check], ...] = (
    ("parallel", lambda e: f"engine.parallel = {e.parallel}" if e.parallel > 1 else None),
    ("kv_fp8", lambda e: 'kv = "fp8"' if e.tensorfold.kv == "fp8" else None),
    ("dense", lambda e: f'dense = "{e.tensorfold.dense}"' if e.tensorfold.dense in ("fp8", "q4") else None),
    ("parallel", lambda e: _set("verify_window", e.tensorfold.verify_window)),
    ("kept_state", lambda e: _set("kept_bytes_gib", e.tensorfold.kept_bytes_gib)),
    ("kept_state", lambda e: _set("keep_per_chat", e.tensorfold.keep_per_chat)),
    ("kept_state", lambda e: _set("kept_share_pct", e.tensorfold.kept_share_pct)),
    ("spill", lambda e: _set("spill_gib", e.tensorfold.spill_gib or None)),
    ("kv_tier", lambda e: _set("kv_tier_gib", e.tensorfold.kv_tier_gib or None)),
    ("display_kv", lambda e: _set("display_kv_mib", e.tensorfold.display_kv_mib or None)),
    ("vision", lambda e: "vision = true" if e.tensorfold.vision else None),
    ("peer_watch", lambda e: _set("peer_timeout_s", e.tensorfold.peer_timeout_s)),
    ("watchdog", lambda e: _set("watchdog_s", e.tensorfold.watchdog_s)),
    ("watchdog", lambda e: "watchdog_exit = true" if e.tensorfold.watchdog_exit else None),
    ("loop_guard", lambda e: "loop_guard = true" if e.tensorfold.loop_guard else None),
)


def _set(name: str, value: object) -> str | None:
    return (
        None if value is None else f"{name} = {value:g}" if isinstance(value, float) else f"{name} = {value}"
    )


def refusals(settings: Settings, profile: ImageProfile) -> list[str]:
    """One line per ``[engine]`` setting that ``profile``'s image cannot honour; empty = all fine."""
    engine = settings.engine
    if engine.kind != "tensorfold":
        return []
    problems = []
    for feature, needs in _NEEDS:
        setting = needs(engine)
        if setting is not None and feature not in profile.supports:
            key = setting if setting.startswith("engine.") else f"engine.tensorfold.{setting}"
            problems.append(f"{key} needs {FEATURES[feature]}, feature {feature!r}")
    if engine.parallel > 1 and "parallel" in profile.supports and engine.tensorfold.drafter == "none":
        problems.append(
            f"engine.parallel = {engine.parallel} needs the DFlash2 drafter: set engine.tensorfold.drafter "
            "to its folder, or engine.parallel = 1 (MTP drafts serve one request at a time)"
        )
    window = _bf16_window(engine)
    if window is not None and engine.context > window:
        problems.append(
            f"engine.context = {engine.context} does not fit a bf16 KV cache here (about {window} tokens "
            'do): lower it, or set engine.tensorfold.kv = "fp8" on an image that supports it'
        )
    return problems


def refusal(settings: Settings, profile: ImageProfile) -> str | None:
    """The one message that refuses these settings for this image; None when it honours them all."""
    problems = refusals(settings, profile)
    if not problems:
        return None
    return (
        f"{profile} cannot honour these [engine] settings: {'; '.join(problems)}. Change them, or run an "
        "image whose patch series provides them (docs/patches.md)"
    )


def _bf16_window(engine: EngineSettings) -> int | None:
    """The window a bf16 KV cache fits on a Spark pair (the recipe's defaults); None with FP8 KV."""
    tf = engine.tensorfold
    if tf.kv == "fp8":
        return None
    if engine.parallel == 1:
        return BF16_WINDOWS["single"]
    if tf.vision and tf.dense in (None, "bf16", "fp8"):
        return BF16_WINDOWS["vision"]
    return BF16_WINDOWS["several"]
