"""bench/sql/run.py's floor: each view question asked over a bare read_parquet of its pre-joined table's files."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from bench.sql.fast_lake import FastLakeConfig, write_lake
from bench.sql.questions import questions
from bench.sql.run import _one_query, floor_sql
from store.compact import compact
from store.lake import Lake
from store.sql import connect

ROLLOUTS = 16


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Lake:
    root = tmp_path_factory.mktemp("fast") / "lake"
    write_lake(str(root), FastLakeConfig.for_rollouts(ROLLOUTS, per_commit=8), rollouts=ROLLOUTS, workers=0)
    compacted = Lake(str(root))
    compact(compacted, vacuum_retention=timedelta(0))
    return compacted


def rows(con, sql: str) -> list[dict]:
    return sorted(con.execute(sql).to_arrow_table().to_pylist(), key=repr)


def test_a_floor_reads_the_files_and_answers_as_the_view(lake: Lake) -> None:
    con = connect(lake)
    try:
        (rollout_id,) = con.execute("SELECT rollout_id FROM rollout_starts ORDER BY rollout_id LIMIT 1").fetchone()
        floors = {q.name: (q, floor_sql(lake, q.view)) for q in questions(rollout_id)}
        asked = {name: floor for name, (_, floor) in floors.items() if floor is not None}
        assert {"calls_by_model_finish", "tool_error_rates", "prompt_token_total"} <= set(asked)
        for name, (q, floor) in floors.items():
            assert floor_sql(lake, q.raw) is None, name  # the raw forms read the typed tables
            if floor is not None:
                assert "read_parquet([" in floor and Path(lake.root).name in floor, name
                assert rows(con, floor) == rows(con, q.view), name
    finally:
        con.close()


def test_each_question_asked_alone_answers_as_the_kept_connection(lake: Lake) -> None:
    """``_one_query`` asks as ``trajlake sql`` does (``run_query``, its own connection) and says whether the rows are
    the kept connection's."""
    con = connect(lake)
    try:
        (rollout_id,) = con.execute("SELECT rollout_id FROM rollout_starts ORDER BY rollout_id LIMIT 1").fetchone()
        for q in questions(rollout_id):
            expected = con.execute(q.view).to_arrow_table().to_pylist()
            once = _one_query(lake, q, expected)
            assert once["one_query_same_answer"], q.name
            assert once["one_query_s"] >= 0 and once["one_query_cpu_s"] >= 0
            assert not _one_query(lake, q, [*expected, {"other": 1}])["one_query_same_answer"], q.name
    finally:
        con.close()
