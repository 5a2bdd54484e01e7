"""sparkfold: serve GLM-5.3-Flash from a pair of DGX Sparks.

The package is the serving runtime that runs on each node (``sparkfold engine``, ``sparkfold api``)
and the node-side checks the Ansible roles ask (``sparkfold config check``, ``preflight``, ``fabric``).
"""

# Written by setuptools-scm when the package is built or installed (the git tag's version and the
# commit, docs/releasing.md); a source tree that never was (PYTHONPATH=runtime) names itself unbuilt.
try:
    from sparkfold._version import __commit_id__ as _node
    from sparkfold._version import __version__
except ImportError:  # pragma: no cover - depends on how the tree was set up
    __version__ = "0.0.0+unbuilt"
    _node = None
# setuptools-scm names the commit "g<abbreviated hash>" (git describe's form); the hash alone.
__commit_id__: str | None = _node.removeprefix("g") if _node else None

__all__ = ["__commit_id__", "__version__", "version_line"]


def version_line() -> str:
    """``0.4.0 (commit 1a2b3c4)``: what ``sparkfold --version`` and the gateway's /health name."""
    return f"{__version__} (commit {__commit_id__ or 'unknown'})"
