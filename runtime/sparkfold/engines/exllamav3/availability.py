"""Whether exllamav3 can run here: it (and torch with CUDA) load only when the engine starts.

Nothing else in this package imports exllamav3 or torch at module import, so CPU-only tests and
``sparkfold --help`` never need them.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["Exllamav3Unavailable", "import_exllamav3"]


class Exllamav3Unavailable(RuntimeError):
    """exllamav3 or a CUDA device is missing on this host."""


def import_exllamav3() -> ModuleType:
    """``exllamav3`` (which loads or builds its CUDA extension); a clear error when it cannot run here."""
    try:
        torch = importlib.import_module("torch")
    except ImportError as exc:
        raise Exllamav3Unavailable(f"the exllamav3 engine needs torch with CUDA: {exc}") from None
    if not torch.cuda.is_available():
        raise Exllamav3Unavailable(
            'engine.kind = "exllamav3" needs an NVIDIA GPU with CUDA; none is visible here '
            '(use kind = "transformers" on CPU)'
        )
    try:
        return importlib.import_module("exllamav3")
    except ImportError as exc:
        raise Exllamav3Unavailable(
            f"exllamav3 is not installed ({exc}); install sparkfold[exllamav3] (exllamav3 >= 1.6.5)"
        ) from None
