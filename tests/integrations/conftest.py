"""Fixtures for the RL frameworks' tests: each framework's own code runs in its own venv (.venvs/NAME, built by
scripts/framework_venvs.sh from scripts/venvs/NAME.sh), never in the project's .venv."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def framework_python(name: str) -> Path:
    """The interpreter of .venvs/NAME; skips (a failure under TITO_REQUIRE_FRAMEWORKS=1) when it was not built."""
    python = REPO / ".venvs" / name / "bin" / "python"
    if not python.exists():
        pytest.skip(f".venvs/{name} is missing: bash scripts/framework_venvs.sh {name}")
    return python
