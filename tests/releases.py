"""The previous release of this checkout, and its tree beside it (the testbed's upgrade drill, the
previous example inventory against today's roles).

The previous release is the newest one before HEAD (HEAD itself excluded: on a release commit the
drill upgrades from the release before it): the newest tag ``vX.Y.Z`` reachable from HEAD's parents,
else, in a clone without tags, the newest commit there whose subject starts ``Release X.Y.Z``
(docs/releasing.md names release commits so). A shallow clone may hold neither: the drill is then
skipped, saying so.

The release's tree is written out with ``git archive`` (the repository's metadata is not written,
as ``git worktree add`` would), and setuptools-scm is told its version and commit
(``SETUPTOOLS_SCM_PRETEND_VERSION`` / ``_METADATA``): with or without tags in the clone, its wheel is
the release's, named as a checkout of the tag names it.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

TAG = "v[0-9]*.[0-9]*.[0-9]*"
SUBJECT = r"^Release [0-9]+\.[0-9]+\.[0-9]+"


@dataclass(frozen=True)
class Release:
    version: str  # X.Y.Z
    commit: str  # the full hash
    found_by: str  # "tag vX.Y.Z" or "subject 'Release X.Y.Z…'"

    @property
    def env(self) -> dict[str, str]:
        """What setuptools-scm needs to name a build of the release's tree as the tag would."""
        return {
            "SETUPTOOLS_SCM_PRETEND_VERSION": self.version,
            "SETUPTOOLS_SCM_PRETEND_METADATA": f'{{node="g{self.commit[:9]}"}}',
        }


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=False)
    return done.stdout.strip() if done.returncode == 0 else ""


def previous_release(repo: Path) -> Release | str:
    """The newest release before HEAD, or why there is none to be found."""
    tag = _git(repo, "describe", "--tags", "--abbrev=0", "--match", TAG, "HEAD^")
    if tag:
        return Release(tag.removeprefix("v"), _git(repo, "rev-list", "-n", "1", tag), f"tag {tag}")
    found = _git(repo, "log", "-1", "-E", f"--grep={SUBJECT}", "--format=%H %s", "HEAD^")
    if found:
        commit, subject = found.split(" ", 1)
        version = re.match(r"Release ([0-9.]+[0-9])", subject)
        assert version, subject
        return Release(version[1], commit, f"subject '{subject[:40]}…'")
    shallow = _git(repo, "rev-parse", "--is-shallow-repository") == "true"
    hint = " (a shallow clone: git fetch --unshallow --tags)" if shallow else ""
    return f"no release before HEAD in this clone: neither a tag vX.Y.Z nor a commit 'Release X.Y.Z'{hint}"


def write_tree(repo: Path, release: Release, folder: Path, *paths: str) -> Path:
    """The release's tree (or only ``paths`` of it) written into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    archive = subprocess.Popen(
        ["git", "-C", str(repo), "archive", release.commit, *paths], stdout=subprocess.PIPE
    )
    subprocess.run(["tar", "-x", "-C", str(folder)], stdin=archive.stdout, check=True)
    assert archive.wait() == 0, f"git archive {release.commit} {' '.join(paths)} failed"
    return folder
