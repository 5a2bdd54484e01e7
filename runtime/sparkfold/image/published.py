"""The reference recipe's image label, and a published engine image pulled by digest.

:func:`recipe_label` is the recipe's own formula (``scripts/prepare.sh``; recipe.md §4.2, §13.1):
the first 12 hex digits of ``sha256(cat patches/*.patch; echo "$IMAGE_EXTRAS")`` — every patch's
bytes in order, then the pip extras joined by spaces and a newline. An image built from the same
patches and extras carries the same ``tf.patches`` label whether sparkfold or the recipe built it,
so a published image is accepted by that label: :func:`pull_published` pulls
``<registry>/<name>@sha256:<digest>``, refuses it unless its label is the one computed here (the
image is then not tagged, so nothing uses it), and tags it with the local name.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkfold.image.patches import PatchError, Series

__all__ = [
    "RECIPE_LABEL",
    "PublishedImageRefused",
    "Pulled",
    "pull_published",
    "recipe_label",
    "recipe_label_of",
]

RECIPE_LABEL = "tf.patches"
"""The reference recipe's image label: :func:`recipe_label` of the patches and extras inside."""
LABEL_HEX = 12
_PINNED = re.compile(r"^(?P<name>[^@\s]+)@(?P<digest>sha256:[0-9a-f]{64})$")

Run = Callable[[Sequence[str]], subprocess.CompletedProcess[str]]


def recipe_label(patches: Iterable[bytes], extras: Sequence[str]) -> str:
    """First 12 hex of sha256 over the patches' bytes in order, then ``" ".join(extras) + "\\n"``."""
    digest = hashlib.sha256()
    for data in patches:
        digest.update(data)
    digest.update((" ".join(extras) + "\n").encode())
    return digest.hexdigest()[:LABEL_HEX]


def recipe_label_of(series: Sequence[Series], extras: Sequence[str]) -> str:
    """:func:`recipe_label` of several series applied one after the other."""
    return recipe_label((Path(p.path).read_bytes() for s in series for p in s.patches), extras)


class PublishedImageRefused(PatchError):
    """The published image is not the one pinned (wrong label, or not pinned by digest)."""


@dataclass(frozen=True)
class Pulled:
    ref: str
    tag: str
    label: str
    changed: bool


def _docker(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, check=False, timeout=7200)


def _inspect(run: Run, name: str) -> dict[str, Any] | None:
    done = run(["docker", "image", "inspect", name])
    if done.returncode != 0:
        return None
    try:
        found = json.loads(done.stdout)
    except ValueError:
        return None
    return found[0] if isinstance(found, list) and found and isinstance(found[0], dict) else None


def _label(image: dict[str, Any] | None) -> str:
    labels = ((image or {}).get("Config") or {}).get("Labels") or {}
    return str(labels.get(RECIPE_LABEL, ""))


def pull_published(ref: str, *, label: str, tag: str, run: Run = _docker, check: bool = False) -> Pulled:
    """Make ``tag`` the published image ``ref`` (by digest), accepted only with ``tf.patches=label``.

    Nothing is pulled when ``tag`` already is that image (its digest and label match). ``check``
    only says whether a pull is due (``changed``), pulling nothing.
    """
    pinned = _PINNED.match(ref)
    if pinned is None:
        raise PublishedImageRefused(
            f"{ref}: a published image is pulled by digest only: <name>@sha256:<64 hex>"
        )
    if not re.fullmatch(r"[0-9a-f]{12}", label):
        raise PublishedImageRefused(f"the expected {RECIPE_LABEL} label is 12 hex digits, not {label!r}")
    current = _inspect(run, tag)
    digests = [str(d) for d in (current or {}).get("RepoDigests") or []]
    if _label(current) == label and any(d.endswith("@" + pinned["digest"]) for d in digests):
        return Pulled(ref, tag, label, changed=False)
    if check:
        return Pulled(ref, tag, label, changed=True)
    done = run(["docker", "pull", ref])
    if done.returncode != 0:
        detail = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise PublishedImageRefused(
            f"docker pull {ref} failed: {detail}. No image with digest {pinned['digest']} (to be accepted "
            f"with {RECIPE_LABEL}={label}) came from {pinned['name']}, so {tag} is left as it was: check "
            "the digest against the one published, and that this node reaches the registry"
        )
    found = _label(_inspect(run, ref))
    if found != label:
        raise PublishedImageRefused(
            f"{ref} carries {RECIPE_LABEL}={found or '(none)'}, not {label}: it was built from other patches "
            f"or extras than the series pinned here, so it is refused and {tag} is left as it was. Pin the "
            "digest published for this series, or build the image here"
        )
    tagged = run(["docker", "tag", ref, tag])
    if tagged.returncode != 0:
        raise PublishedImageRefused(f"docker tag {ref} {tag} failed: {tagged.stderr.strip()}")
    return Pulled(ref, tag, label, changed=True)
