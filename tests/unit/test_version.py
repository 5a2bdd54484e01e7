"""`sparkfold --version`: the release (the git tag, through setuptools-scm) and the commit."""

from __future__ import annotations

import re

from click.testing import CliRunner

import sparkfold
from sparkfold.cli import main


def test_version_names_the_release_and_the_commit() -> None:
    said = CliRunner().invoke(main, ["--version"])
    assert said.exit_code == 0
    assert said.output == f"sparkfold {sparkfold.__version__} (commit {sparkfold.__commit_id__})\n"
    # an installed tree (make venv, the nodes' wheel) knows both; the hash without git describe's "g"
    assert sparkfold.__version__ != "0.0.0+unbuilt"
    assert re.fullmatch(r"[0-9a-f]{7,40}", sparkfold.__commit_id__ or "")
