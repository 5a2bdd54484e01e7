"""What can go wrong with the weights store.

Every expected failure is a :class:`WeightsError` whose message is one line that names the thing and
says what to do; the CLI prints it as is and exits 1::

    WeightsError            any expected failure of a weights command
    ├── ManifestError       a manifest file is missing, unreadable or malformed
    ├── VerifyError         the files on disk differ from the manifest (carries the report;
    │                       in verify.py, beside the report)
    ├── PinError            a fetched file's sha256 is not the one pinned for it (names both)
    ├── DiskSpaceError      the store's filesystem cannot hold what is still missing
    ├── RevisionError       a moving revision where a pin is required, or one the Hub does not have
    ├── TokenFileError      the Hugging Face token file is missing or empty
    └── HubError            the Hub refused or could not be reached (auth, gated, not found, offline)
"""

from __future__ import annotations

__all__ = [
    "DiskSpaceError",
    "HubError",
    "ManifestError",
    "PinError",
    "RevisionError",
    "TokenFileError",
    "WeightsError",
]


class WeightsError(Exception):
    """An expected failure; ``str()`` is the one line the operator sees."""


class ManifestError(WeightsError):
    pass


class PinError(WeightsError):
    pass


class DiskSpaceError(WeightsError):
    pass


class RevisionError(WeightsError):
    pass


class TokenFileError(WeightsError):
    pass


class HubError(WeightsError):
    pass
