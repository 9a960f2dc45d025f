"""The tail's recomputed rows kept on disk (store.tail_cache): a one-shot query (``run_query``) after the first reads
them instead of recomputing the tail; every answer stays what views.sql computes over the typed tables, whatever
commits, forgets or compactions land before, between or during the queries."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.store.lake_builder import event, sample_rollout
from tests.store.test_prejoin import Offsets, answers, raw_answers, same

import store.sql as sql_module
from schemas.table_names import COMPACTED_ROLLOUTS_TABLE, COMPACTED_TOOL_STEPS_TABLE
from schemas.tables import TYPED_TABLES
from store import prejoin, tail_cache
from store.forget import ForgetRequest, forget
from store.lake import Lake
from store.prejoin import refresh
from store.sql import run_query


@pytest.fixture
def offsets() -> Offsets:
    return Offsets()


@pytest.fixture(autouse=True)
def quiet_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tests' tails are written just before they are read: kept without waiting (``QUIET_S``)."""
    monkeypatch.setattr(tail_cache, "QUIET_S", 0.0)


def kept_files(lake: Lake) -> list[str]:
    root = Path(lake.root) / tail_cache.CACHE_DIR
    return sorted(str(p.relative_to(root)) for p in root.glob("*/*.duckdb")) if root.exists() else []


def recomputes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A list that gets one entry per recompute of the tail from the typed tables."""
    calls: list[str] = []
    real = prejoin.define_fresh

    def counted(*args: Any, **kwargs: Any) -> None:
        calls.append("recomputed")
        real(*args, **kwargs)

    monkeypatch.setattr(prejoin, "define_fresh", counted)
    return calls


def with_tail(lake: Lake, offsets: Offsets) -> None:
    offsets.write(lake, sample_rollout("r1") + sample_rollout("r2"))
    refresh(lake)
    offsets.write(lake, sample_rollout("r3") + [event("reward", {"name": "late", "value": 1.0}, seq=20,
                                                       rollout_id="r1")])


def test_the_next_one_shot_reads_the_kept_rows(lake, offsets, tmp_path, monkeypatch):
    with_tail(lake, offsets)
    first = answers(lake)
    assert kept_files(lake), "the first one-shot queries kept what they recomputed"
    calls = recomputes(monkeypatch)
    assert answers(lake) == first == raw_answers(lake, tmp_path)
    assert calls == [], "a later one-shot query recomputed the tail"


def test_a_commit_after_the_rows_were_kept_is_seen(lake, offsets, tmp_path):
    with_tail(lake, offsets)
    answers(lake)
    offsets.write(lake, sample_rollout("r4") + [event("reward", {"name": "later", "value": 2.0}, seq=21,
                                                       rollout_id="r3")])
    got = same(lake, tmp_path, "+tail")
    assert [(r["rollout_id"], r["n_rewards"]) for r in got["rollouts"]] == [("r1", 4), ("r2", 3), ("r3", 4),
                                                                            ("r4", 3)]
    refresh(lake)  # the tail folded in: nothing to keep, the kept rows never read again
    assert same(lake, tmp_path, "compacted") == got


def test_a_commit_while_a_one_shot_pins_the_tables_keeps_nothing_stale(lake, offsets, tmp_path, monkeypatch):
    """A commit lands after the versions were walked, before the typed tables were pinned: the connection's tables
    are newer than the walk, so it keeps nothing under that walk's key; the next query sees the commit."""
    with_tail(lake, offsets)
    real, raced = sql_module.attach_table, []

    def commit_meanwhile(*args: Any, **kwargs: Any) -> None:
        if not raced:
            raced.append(True)
            offsets.write(lake, sample_rollout("r4"))
        real(*args, **kwargs)

    with monkeypatch.context() as patched:
        patched.setattr(sql_module, "attach_table", commit_meanwhile)
        got = run_query(lake, "SELECT rollout_id, n_llm_calls FROM rollouts ORDER BY 1").to_pylist()
    assert raced
    assert [r["rollout_id"] for r in got] in (["r1", "r2", "r3"], ["r1", "r2", "r3", "r4"])
    assert kept_files(lake) == []
    assert [r["rollout_id"] for r in same(lake, tmp_path, "+tail")["rollouts"]] == ["r1", "r2", "r3", "r4"]


def test_a_forget_while_rows_are_kept_leaves_none_of_them(lake, offsets, tmp_path, monkeypatch):
    """A forget whose delete commits while a one-shot writes the tail's rows: the written key is stale (its files
    removed), and the forget removes every kept file; the forgotten rollout is in no answer and no file."""
    with_tail(lake, offsets)
    real, raced = tail_cache.write, []

    def forget_meanwhile(*args: Any, **kwargs: Any) -> bool:
        written = real(*args, **kwargs)
        if not raced:
            raced.append(True)
            forget(lake, ForgetRequest(rollouts=("r3",)))
        return written

    with monkeypatch.context() as patched:
        patched.setattr(tail_cache, "write", forget_meanwhile)
        run_query(lake, "SELECT count(*) FROM llm_calls")
    assert raced
    assert kept_files(lake) == []
    got = same(lake, tmp_path, "+tail")
    assert "r3" not in {r["rollout_id"] for rows in got.values() for r in rows if "rollout_id" in r}
    refresh(lake)  # a forget drops the log entries before it: a tail is kept again once compacted since
    offsets.write(lake, sample_rollout("r4"))
    answers(lake)
    assert kept_files(lake)
    forget(lake, ForgetRequest(rollouts=("r1",)))
    assert kept_files(lake) == []


def test_a_compaction_between_one_shots_reads_the_new_marks(lake, offsets, tmp_path, monkeypatch):
    with_tail(lake, offsets)
    answers(lake)
    refresh(lake)
    offsets.write(lake, sample_rollout("r4"))
    calls = recomputes(monkeypatch)
    assert same(lake, tmp_path, "+tail") == raw_answers(lake, tmp_path)
    assert calls, "rows kept for the old marks were read for the new ones"


def test_a_tail_still_being_written_is_recomputed_in_the_statement(lake, offsets, tmp_path, monkeypatch):
    """A typed table took a commit less than ``QUIET_S`` ago: keeping the rows would cost this question a whole
    recompute for a key the next commit makes stale; nothing is written, answers as views.sql."""
    monkeypatch.setattr(tail_cache, "QUIET_S", 3600.0)
    with_tail(lake, offsets)
    assert answers(lake) == raw_answers(lake, tmp_path)
    assert kept_files(lake) == []


def test_a_lake_whose_folder_cannot_be_written_still_answers(lake, offsets, tmp_path):
    with_tail(lake, offsets)
    (Path(lake.root) / "_sql_cache").write_text("not a folder")  # the kept rows cannot be written under it
    assert answers(lake) == raw_answers(lake, tmp_path)
    assert kept_files(lake) == []


def test_only_the_newest_keys_are_kept(lake, offsets, monkeypatch):
    monkeypatch.setattr(tail_cache, "KEEP", 2)
    with_tail(lake, offsets)
    for rollout in ("r4", "r5", "r6"):
        offsets.write(lake, sample_rollout(rollout))
        run_query(lake, "SELECT count(*) FROM llm_calls")
    assert len({path.split("/")[0] for path in kept_files(lake)}) == 2


ONE_SHOT = """
import json, sys
sys.argv = ["trajlake", "sql", "--lake", sys.argv[1], "SELECT count(*) AS n FROM llm_calls"]
from trajlake.cli import main
try:
    main()
except SystemExit as exc:
    assert not exc.code, exc.code
print(json.dumps(sorted(sys.modules)))
"""


def test_a_one_shot_over_kept_rows_loads_no_arrow(lake, offsets):
    """``trajlake sql`` over a tail kept by an earlier one-shot reads the marks, the log and DuckDB files only: it loads
    neither pyarrow nor deltalake nor the catalogue's Arrow schemas (0.1-0.3 s of start-up)."""
    with_tail(lake, offsets)
    run_query(lake, "SELECT count(*) AS n FROM llm_calls")
    assert kept_files(lake)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAJLAKE_")}
    done = subprocess.run([sys.executable, "-c", ONE_SHOT, lake.root], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "6" in done.stdout and "1 row" in done.stdout  # r1, r2, r3: two calls each
    modules = set(json.loads(done.stdout.splitlines()[-1]))
    assert {m.partition(".")[0] for m in modules} & {"pyarrow", "deltalake", "polars"} == set()
    assert "schemas.tables" not in modules


def test_the_sources_are_the_typed_tables():
    assert prejoin.SOURCES == tuple(name for name, _ in TYPED_TABLES.values())


def scratch_files(lake: Lake) -> list[str]:
    """Files of the cache that are not kept rows (a write's scratch and its write-ahead log)."""
    root = Path(lake.root) / tail_cache.CACHE_DIR
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and p.suffix != ".duckdb") \
        if root.exists() else []


@pytest.mark.parametrize("failure", ["disk full", "interrupted"])
def test_a_write_that_fails_leaves_no_scratch_and_the_answer_stands(lake, offsets, tmp_path, monkeypatch, failure):
    """review3: a failing CREATE (a full disk) escaped as an error of the query, and it or a Ctrl-C before the
    rename left the scratch file behind for good, one more each try."""
    with_tail(lake, offsets)
    real = tail_cache.write

    def interrupted(*args: Any) -> None:
        raise KeyboardInterrupt

    def failing(con: Any, lk: Lake, key: str, rows: dict[str, str], touched: str) -> bool:
        if failure == "disk full":
            rows = {view: f"SELECT * FROM ({q}) WHERE error('No space left on device') IS NULL" for view, q in rows.items()}
        return real(con, lk, key, rows, touched)

    with monkeypatch.context() as patched:
        patched.setattr(tail_cache, "write", failing)
        if failure == "interrupted":
            patched.setattr(tail_cache.os, "replace", interrupted)
        if failure == "interrupted":
            with pytest.raises(KeyboardInterrupt):
                run_query(lake, "SELECT count(*) FROM llm_calls")
        else:
            for _ in range(2):
                assert run_query(lake, "SELECT count(*) FROM llm_calls").num_rows == 1
    assert scratch_files(lake) == []
    assert answers(lake) == raw_answers(lake, tmp_path)
    assert kept_files(lake), "a later one-shot keeps the rows"


def test_a_damaged_kept_file_is_recomputed_and_written_again(lake, offsets, tmp_path):
    """review3: a kept file cut short (an interrupted copy of the lake) failed every one-shot as "a bug"."""
    with_tail(lake, offsets)
    answers(lake)
    for kept in kept_files(lake):
        path = Path(lake.root) / tail_cache.CACHE_DIR / kept
        with open(path, "r+b") as f:
            f.truncate(path.stat().st_size // 2)
    assert answers(lake) == raw_answers(lake, tmp_path)
    assert answers(lake) == raw_answers(lake, tmp_path)  # the damaged key discarded, written again, read


def test_a_tail_too_big_to_hold_in_memory_is_not_kept(lake, offsets, tmp_path, monkeypatch):
    """review3: writing the rows reads every column of the tail at once (1 GiB for 150 long-context rollouts)."""
    monkeypatch.setattr(tail_cache, "MAX_TAIL_BYTES", 1)
    with_tail(lake, offsets)
    assert answers(lake) == raw_answers(lake, tmp_path)
    assert kept_files(lake) == []


def test_running_out_of_memory_while_keeping_the_rows_answers_by_recomputing(lake, offsets, tmp_path, monkeypatch):
    """review3: under a memory cap the one-shot that keeps the rows failed with DuckDB's OutOfMemoryException."""
    import duckdb

    with_tail(lake, offsets)
    real = prejoin.define_fresh

    def out_of_memory(*args: Any, materialize: bool = False, **kwargs: Any) -> None:
        if materialize:
            raise duckdb.OutOfMemoryException("Out of Memory Error: could not allocate block of size 256.0 KiB")
        real(*args, materialize=materialize, **kwargs)

    monkeypatch.setattr(prejoin, "define_fresh", out_of_memory)
    assert answers(lake) == raw_answers(lake, tmp_path)
    assert kept_files(lake) == []


def long_rollout(rollout_id: str, tokens: int) -> list[dict[str, Any]]:
    ids = [(i * 7919) % 150_000 for i in range(tokens)]
    return [
        event("rollout.started", {"policy_version": "p7"}, seq=0, rollout_id=rollout_id),
        event("llm.request", {"call_id": "c1", "model": "qwen", "prompt_token_ids": ids}, seq=1, rollout_id=rollout_id),
        event("llm.response", {"call_id": "c1", "text": "ok", "finish_reason": "stop", "response_token_ids": [4],
                               "logprobs": [-0.5], "token_source": "engine"}, seq=2, rollout_id=rollout_id),
        event("rollout.finished", {"status": "succeeded", "steps": 1}, seq=3, rollout_id=rollout_id),
    ]


@pytest.mark.parametrize("question", ["SELECT count(*) FROM rollouts", "SELECT count(*) FROM llm_calls"])
def test_a_small_tail_over_long_rollouts_is_not_kept(lake, offsets, tmp_path, monkeypatch, question):
    """Late rewards for long-context rollouts: the tail's files are a few KB, but keeping it reads every typed row of
    those rollouts (review: 60 rollouts of 200k-token prompts took a one-shot from 175 to 642 MB behind a 7.8 KB
    tail). Bounded by the compacted tokens of the touched rollouts (``MAX_KEPT_TOKENS``); answers unchanged."""
    monkeypatch.setattr(tail_cache, "MAX_KEPT_TOKENS", 50_000)
    offsets.write(lake, [e for r in range(4) for e in long_rollout(f"r{r}", 20_000)])
    refresh(lake)
    offsets.write(lake, [e for r in range(4) for e in (  # late, small: a reward and a short call per rollout
        event("reward", {"name": "late", "value": 1.0}, seq=9, rollout_id=f"r{r}"),
        event("llm.request", {"call_id": "c2", "model": "qwen", "prompt_token_ids": [1, 2]}, seq=10, rollout_id=f"r{r}"))])
    expected = run_query(lake, question).to_pylist()
    assert kept_files(lake) == [], "a tail over 80,000 compacted tokens was kept past a 50,000 bound"
    monkeypatch.setattr(tail_cache, "MAX_KEPT_TOKENS", 100_000)
    assert run_query(lake, question).to_pylist() == expected
    assert kept_files(lake), "under the bound the tail is kept"


def test_a_kept_file_damaged_in_its_rows_is_discarded_and_the_answer_recomputed(lake, offsets):
    """A page damaged past the header: ATTACH succeeds, the read fails ("Corrupt database file"). The one-shot
    discards the key and answers from the typed tables; the next one writes the files again."""
    with_tail(lake, offsets)
    want = run_query(lake, "SELECT * FROM rollouts ORDER BY rollout_id").to_pylist()
    paths = sorted((Path(lake.root) / tail_cache.CACHE_DIR).glob("*/rollouts.duckdb"))
    assert paths
    for path in paths:
        with open(path, "r+b") as f:  # block 1 (after DuckDB's 3 header pages): the rows' data
            f.seek(3 * 4096 + 262_144)
            f.write(b"\xff" * 4096)
    for _ in range(2):
        assert run_query(lake, "SELECT * FROM rollouts ORDER BY rollout_id").to_pylist() == want
    assert kept_files(lake), "written again"


def test_a_cache_folder_that_cannot_be_written_costs_no_read_of_the_rows(lake, offsets, monkeypatch):
    """A read-only lake (stand-in: ``_sql_cache`` is a file) must not read every column of the tail's rows for a
    write that cannot happen, on every one-shot."""
    with_tail(lake, offsets)
    (Path(lake.root) / "_sql_cache").write_text("not a folder")
    materialized: list[bool] = []
    real = prejoin.define_fresh

    def counted(*args: Any, materialize: bool = False, **kwargs: Any) -> None:
        materialized.append(materialize)
        real(*args, materialize=materialize, **kwargs)

    monkeypatch.setattr(prejoin, "define_fresh", counted)
    for _ in range(2):
        run_query(lake, "SELECT count(*) FROM llm_calls")
    assert materialized == [False, False]


def test_an_unreadable_compacted_file_is_a_query_error_and_keeps_the_kept_rows(lake, offsets, monkeypatch):
    """A lake file gone under the compacted tables (a vacuum, the store's error) is the user's query error, worded
    as any other; the kept rows of the tail are not about it: neither discarded nor recomputed (review2)."""
    with_tail(lake, offsets)
    run_query(lake, "SELECT count(*) FROM tool_steps")
    before = kept_files(lake)
    assert before
    for data in (Path(lake.root) / COMPACTED_TOOL_STEPS_TABLE).glob("*.parquet"):
        data.unlink()
    for data in (Path(lake.root) / COMPACTED_ROLLOUTS_TABLE).glob("*.parquet"):
        data.unlink()
    discarded: list[str] = []
    real = tail_cache.discard
    monkeypatch.setattr(tail_cache, "discard", lambda lake, key: (discarded.append(key), real(lake, key)))
    for question in ("SELECT count(*) FROM tool_steps", "SELECT count(*) FROM rollouts"):
        with pytest.raises(sql_module.QueryError):
            run_query(lake, question)
    assert discarded == [] and kept_files(lake)[:len(before)] == before
