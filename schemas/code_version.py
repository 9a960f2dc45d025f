"""The code version recorded in every dataset manifest and checkpoint record."""

from __future__ import annotations

import subprocess
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path


@cache
def code_version() -> str:
    """``trajlake <package version>`` plus the git commit when running from a checkout."""
    try:
        package = version("trajlake")
    except PackageNotFoundError:
        package = "unknown"
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            cwd=Path(__file__).parent, capture_output=True, text=True, timeout=5, check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return f"trajlake {package}" + (f" git {commit}" if commit else "")
