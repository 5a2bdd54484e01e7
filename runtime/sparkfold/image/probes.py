"""What the image role's probes found, read from their results as Ansible registers them.

The role probes (``roles/sparkfold_image/tasks/``: Docker and the image's series label on every
node, and on the head the tag, the external series, the base image, the recipe's label) and hands
the registered results to ``sparkfold image plan --results`` as they are; these functions read
them, so no rule about what a probe's output means is written in the role's Jinja. A result is a
mapping (``rc``, ``stdout``, ``stderr``, ``stdout_lines``, ``msg``, ``skipped`` ...); a probe that
did not run is ``None``, an empty mapping or one with ``skipped``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

__all__ = [
    "Result",
    "docker_answers",
    "docker_problem",
    "fetch_problem",
    "fetched_files",
    "json_field",
    "pulled_digest",
    "ran",
    "tag_commit",
    "tag_problem",
    "text",
]

Result = Mapping[str, Any] | None

_PEELED = re.compile(r"\^\{\}$")


def ran(result: Result) -> bool:
    """Whether the probe ran (it was not skipped, and there is a result)."""
    return bool(result) and not result.get("skipped", False)  # type: ignore[union-attr]


def _get(result: Result, key: str, default: Any) -> Any:
    return (result or {}).get(key, default)


def text(result: Result) -> str:
    """The probe's output, stripped ('' when it did not run): e.g. the image's series label."""
    return str(_get(result, "stdout", "")).strip()


def docker_answers(result: Result) -> bool:
    """``docker version`` exited 0 (a probe that did not run: no)."""
    return _get(result, "rc", 1) == 0


def docker_problem(result: Result) -> str:
    """Why Docker did not answer, in words: no ``docker`` at all (rc 2 or 127 and nothing on
    stderr) is said so; else docker's own last word, or Ansible's."""
    stderr = str(_get(result, "stderr", ""))
    if _get(result, "rc", 0) in (2, 127) and not stderr:
        return "docker is not installed (not on PATH)"
    return stderr.strip() or str(_get(result, "msg", "")).strip()


def tag_commit(result: Result) -> str:
    """The commit of ``git ls-remote REPO refs/tags/T refs/tags/T^{}``: an annotated tag's commit
    (the peeled ``^{}`` line) wins over the tag object; '' when nothing was listed."""
    lines = [str(line) for line in _get(result, "stdout_lines", None) or []]
    first = next(iter([line for line in lines if _PEELED.search(line)] + lines), "")
    return next(iter(first.split()), "")


def tag_problem(result: Result) -> str:
    """Why the tag did not resolve: rc 2 without a word from git means git is not installed;
    else git's last line on stderr, Ansible's message, or that the tag is not there."""
    if _get(result, "rc", 0) == 2 and not _get(result, "stderr", ""):
        return "git is not installed (not on PATH)"
    said = [str(line) for line in _get(result, "stderr_lines", None) or [] if line]
    return "".join(said[-1:]) or str(_get(result, "msg", "") or "") or "no such tag"


def pulled_digest(result: Result) -> str:
    """The digest of ``docker image inspect --format '{{index .RepoDigests 0}}'`` (NAME@DIGEST)."""
    return ([*str(_get(result, "stdout", "")).split("@"), ""])[1].strip()


def json_field(result: Result, field: str, default: Any) -> Any:
    """A field of the probe's JSON output (``sparkfold ... --json``); ``default`` without one."""
    output = _get(result, "stdout", "") or "{}"
    try:
        found = json.loads(output)
    except ValueError:
        return default
    return found.get(field, default) if isinstance(found, dict) else default


def fetched_files(result: Result) -> list[dict[str, str]]:
    """The verified files of ``sparkfold image fetch --json``, in order: ``[{name, sha256}]``."""
    files = json_field(result, "files", []) or []
    return [{"name": str(f.get("name", "")), "sha256": str(f.get("sha256", ""))} for f in files]


def fetch_problem(result: Result) -> str:
    """Why the fetch refused the series: the command's error (without click's ``Error:``), else
    Ansible's message."""
    said = _get(result, "stderr", None)
    if said is None:
        said = _get(result, "msg", "")
    return re.sub(r"^Error: ", "", str(said)).strip()
