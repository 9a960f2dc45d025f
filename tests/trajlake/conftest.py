"""CLI test fixtures: lakes built with tests/store/lake_builder.py (the SQL tests' builder)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "store"))  # lake_builder, as pytest does for tests/store

from lake_builder import sample_rollout, write_events  # noqa: E402

from store.lake import Lake  # noqa: E402


@pytest.fixture
def sample_lake(lake: Lake) -> Lake:
    """A lake with a finished rollout r1 and a running rollout r2 (2 LLM calls + 1)."""
    write_events(lake, sample_rollout("r1") + sample_rollout("r2", task_id="t2")[:4])
    return lake
