"""What `pip install tito` leaves out, and the message that names the extra which brings it.

The client alone (`pip install .`) needs only grpcio, grpcio-health-checking and protobuf, so it installs beside
any RL framework without moving its transformers or torch. Modules that need more import it when used, through
`require`, so the user reads which extra to install instead of a bare ModuleNotFoundError.
"""

from __future__ import annotations

import importlib
from types import ModuleType


def require(module: str, extra: str, what: str) -> ModuleType:
    """Import `module`; if it (or a package it needs) is not installed, an ImportError naming `extra`.
    `what`: the feature that needs it, as the user called it (\"tito.trl.TitoRollout\")."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name is None or e.name.split(".")[0] == "tito":
            raise  # a broken install of tito itself, not a missing extra
        raise ImportError(
            f"{what} needs {e.name!r}, which the tito client alone does not install: "
            f"pip install 'tito[{extra}]' (in this repository: pip install '.[{extra}]')") from e
