"""A ``_last_checkpoint`` that is there but cannot be read (an object store's 503, a permission error) counts as "the
table moved past the marks": readers then find the tail by the marked offsets and refresh folds it in. Read as
absent, after a forget had dropped the log entry right after the marked version, the tail's rows were silently left
out of every answer and every refresh until the next compaction (review, 2026-12-03)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.store.lake_builder import sample_rollout
from tests.store.test_prejoin import Offsets

from schemas.errors import Conflict

from store.forget import ForgetRequest, forget
from store.lake import Lake
from store.prejoin import refresh
from store.sql import run_query

QUESTION = "SELECT rollout_id FROM rollouts ORDER BY rollout_id"


def forget_behind_a_tail(lake: Lake) -> None:
    """r1, r2 compacted; r3 in the tail; r2 forgotten: the forget's checkpoint drops the entries after the marks."""
    offsets = Offsets()
    offsets.write(lake, sample_rollout("r1") + sample_rollout("r2"))
    refresh(lake)
    offsets.write(lake, sample_rollout("r3"))
    forget(lake, ForgetRequest(rollouts=("r2",)))


def rollout_ids(lake: Lake) -> list[str]:
    return [row["rollout_id"] for row in run_query(lake, QUESTION).to_pylist()]


@pytest.fixture
def pointer_unreadable(monkeypatch: pytest.MonkeyPatch) -> None:
    real = Lake._read_bytes
    monkeypatch.setattr(Lake, "_read_bytes", lambda self, path: _refuse(path) if path.endswith("_last_checkpoint")
                        else real(self, path))


def test_an_absent_pointer_is_not_past_and_a_readable_one_is_compared(lake: Lake) -> None:
    forget_behind_a_tail(lake)
    assert lake.checkpointed_past("rollout_starts", 0)
    assert not lake.checkpointed_past("rollout_starts", 10_000)
    assert not lake.checkpointed_past("no_such_table", 0)


def test_a_local_unreadable_pointer_keeps_the_tail_in_answers(lake: Lake, request: pytest.FixtureRequest) -> None:
    forget_behind_a_tail(lake)
    request.getfixturevalue("pointer_unreadable")
    assert not (Path(lake.root) / "rollout_starts/_delta_log" / f"{1:020d}.json").exists()
    assert lake.checkpointed_past("rollout_starts", 0)
    assert rollout_ids(lake) == ["r1", "r3"]


def test_refresh_never_skips_a_tail_it_cannot_tell(lake: Lake, monkeypatch: pytest.MonkeyPatch) -> None:
    """While the pointer cannot be read, refresh cannot tell whether a delete landed: it refuses (exit non-zero,
    "run again"), it never reports "unchanged"; once the pointer reads, it folds the tail in."""
    forget_behind_a_tail(lake)
    with monkeypatch.context() as patched:
        real = Lake._read_bytes
        patched.setattr(Lake, "_read_bytes", lambda self, path: _refuse(path) if path.endswith("_last_checkpoint")
                        else real(self, path))
        with pytest.raises(Conflict):
            refresh(lake)
    assert refresh(lake).rollouts > 0
    assert rollout_ids(lake) == ["r1", "r3"]


def _refuse(path: str) -> bytes:
    raise PermissionError(13, "Permission denied", path)


class FailingPointerReads:
    """An object store that answers every request but a GET of ``_last_checkpoint`` (a 503 there)."""

    def __init__(self, real: object) -> None:
        self.real = real

    def open_input_stream(self, path: str, *args: object, **kwargs: object) -> object:
        if path.endswith("_last_checkpoint"):
            raise OSError("AWS Error SLOW_DOWN during GetObject operation: Please reduce your request rate.")
        return self.real.open_input_stream(path, *args, **kwargs)

    def __getattr__(self, name: str) -> object:
        return getattr(self.real, name)


def test_s3_a_503_on_the_pointer_keeps_the_tail(s3_lake: Lake) -> None:
    forget_behind_a_tail(s3_lake)
    assert rollout_ids(s3_lake) == ["r1", "r3"]
    filesystem, root = s3_lake._filesystem
    s3_lake.__dict__["_filesystem"] = (FailingPointerReads(filesystem), root)
    assert rollout_ids(s3_lake) == ["r1", "r3"]
