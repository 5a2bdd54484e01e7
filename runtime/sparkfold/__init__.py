"""sparkfold: serve GLM-5.3-Flash from a pair of DGX Sparks.

The package is the serving runtime that runs on each node (``sparkfold engine``, ``sparkfold api``)
and the node-side checks the Ansible roles ask (``sparkfold config check``, ``preflight``, ``fabric``).
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
