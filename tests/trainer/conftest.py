"""Fixtures shared by the trainer tests: the tiny default model."""

from __future__ import annotations

from pathlib import Path

import pytest

from trajlake.tiny_model import build_tiny_model, default_model_dir


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """The tiny default model folder (built once into ``$TRAJLAKE_HOME``, then reused).

    Shared by every test and every run: treat it as read-only (copy it before
    changing anything, e.g. ``shutil.copytree(tiny_model_dir, tmp_path / "m")``).
    """
    return build_tiny_model(default_model_dir())
