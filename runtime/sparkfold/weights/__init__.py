"""The weights store on a node: manifests, verification, disk checks, the Hugging Face source.

``sparkfold weights …`` (``commands/weights_cmd.py``) is the thin front; the ``sparkfold_weights``
Ansible role calls it and asserts on its ``--json`` answer. See docs/weights.md.
"""

from sparkfold.weights.errors import (
    DiskSpaceError,
    HubError,
    ManifestError,
    PinError,
    RevisionError,
    TokenFileError,
    WeightsError,
)
from sparkfold.weights.manifest import (
    Manifest,
    ManifestFile,
    build_manifest,
    default_manifest_path,
    list_files,
    read_manifest,
    write_manifest,
)
from sparkfold.weights.verify import VerifyError, VerifyReport, verify_dir

__all__ = [
    "DiskSpaceError",
    "HubError",
    "Manifest",
    "ManifestError",
    "ManifestFile",
    "PinError",
    "RevisionError",
    "TokenFileError",
    "VerifyError",
    "VerifyReport",
    "WeightsError",
    "build_manifest",
    "default_manifest_path",
    "list_files",
    "read_manifest",
    "verify_dir",
    "write_manifest",
]
