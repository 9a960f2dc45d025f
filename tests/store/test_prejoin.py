"""The pre-joined tables (store.prejoin): the llm_calls and rollouts views read them once a lake is compacted,
and every answer stays what views.sql computes over the typed tables, whatever arrived since; forget, retention
and rebuild keep them honest."""

from __future__ import annotations

import shutil
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from deltalake import write_deltalake
from tests.store.lake_builder import T0, event, sample_rollout, write_events
from tests.store.test_view_shapes import messy_rollout

from schemas.tables import (
    COMPACTED_LLM_CALLS_TABLE,
    COMPACTED_ROLLOUTS_TABLE,
    COMPACTED_TOOL_STEPS_TABLE,
    COMPACTION_MARKS_TABLE,
)
import store.forget as forget_module
from store import prejoin
from store.compact import compact
from store.forget import ForgetRequest, forget
from store.lake import Lake
from store.prejoin import refresh
from store.rebuild import rebuild_typed_tables
from store.retention import RetentionPolicy, apply_retention
from store.sql import connect, run_query

DERIVED = (COMPACTED_LLM_CALLS_TABLE, COMPACTED_TOOL_STEPS_TABLE, COMPACTED_ROLLOUTS_TABLE, COMPACTION_MARKS_TABLE)
QUERIES = {
    "calls": "SELECT * FROM llm_calls ORDER BY tenant, rollout_id, call_id",
    "steps": "SELECT * FROM tool_steps ORDER BY tenant, rollout_id, call_id",
    "rollouts": "SELECT * FROM rollouts ORDER BY tenant, rollout_id",
    "prompts": "SELECT * FROM llm_call_prompts ORDER BY tenant, rollout_id, call_id",
    "counts": "SELECT (SELECT count(*) FROM llm_calls) AS calls, (SELECT count(*) FROM rollouts) AS rollouts",
}


def answers(lake: Lake) -> dict[str, list[dict[str, Any]]]:
    return {name: run_query(lake, sql).to_pylist() for name, sql in QUERIES.items()}


def raw_answers(lake: Lake, tmp_path: Path) -> dict[str, list[dict[str, Any]]]:
    """The answers of views.sql's views over the typed tables: a copy of the lake without the derived tables."""
    copy = tmp_path / f"raw-{len(list(tmp_path.glob('raw-*')))}"
    shutil.copytree(lake.root, copy)
    for table in DERIVED:
        shutil.rmtree(copy / table, ignore_errors=True)
    return answers(Lake(str(copy)))


def path_taken(lake: Lake) -> str:
    """How a connection's llm_calls and rollouts read: ``typed`` tables, ``compacted`` alone, or ``+tail``."""
    con = connect(lake)
    try:
        sql = " ".join(r[0] for r in con.execute(
            "SELECT sql FROM duckdb_views() WHERE view_name IN ('llm_calls', 'tool_steps', 'rollouts')").fetchall())
    finally:
        con.close()
    if "_fresh." in sql:
        return "+tail"
    return "compacted" if "_compacted_" in sql else "typed"


def same(lake: Lake, tmp_path: Path, path: str) -> dict[str, list[dict[str, Any]]]:
    """Check the views answer as views.sql does, reading the way ``path`` says; return the answers."""
    got = answers(lake)
    assert got == raw_answers(lake, tmp_path)
    assert path_taken(lake) == path
    return got


def compacted_rows(lake: Lake) -> dict[str, list[dict[str, Any]]]:
    """The pre-joined tables' rows, keyed as ``answers`` keys the views'."""
    return {name: run_query(lake, f"SELECT * FROM {table} ORDER BY {order}").to_pylist()
            for name, table, order in (("calls", COMPACTED_LLM_CALLS_TABLE, "tenant, rollout_id, call_id"),
                                       ("steps", COMPACTED_TOOL_STEPS_TABLE, "tenant, rollout_id, call_id"),
                                       ("rollouts", COMPACTED_ROLLOUTS_TABLE, "tenant, rollout_id"))}


def tables_part(got: dict[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    return {name: got[name] for name in ("calls", "steps", "rollouts")}


class Offsets:
    """Kafka offsets that continue across a test's batches, as the ingester's do."""

    def __init__(self) -> None:
        self.next = 0

    def write(self, lake: Lake, events: list) -> None:
        write_events(lake, events, first_offset=self.next)
        self.next += len(events)


@pytest.fixture
def offsets() -> Offsets:
    return Offsets()


def test_never_compacted_reads_the_typed_tables(lake, offsets, tmp_path):
    offsets.write(lake, sample_rollout("r1"))
    same(lake, tmp_path, "typed")


def test_after_compaction_the_views_are_the_tables(lake, offsets, tmp_path):
    first, second = messy_rollout("r1")
    offsets.write(lake, first + second + sample_rollout("r2", tenant="acme"))
    result = refresh(lake)
    assert (result.incremental, result.rollouts, result.calls) == (False, 2, 4)
    got = same(lake, tmp_path, "compacted")
    assert compacted_rows(lake) == tables_part(got)


def test_the_first_run_writes_in_buckets(lake, offsets, tmp_path, monkeypatch):
    monkeypatch.setattr(prejoin, "BUCKET_CALLS", 3)
    offsets.write(lake, [e for r in ("r1", "r2", "r3", "r4") for e in sample_rollout(r)])
    result = refresh(lake)
    assert (result.buckets, result.rollouts, result.calls) == (3, 4, 8)
    same(lake, tmp_path, "compacted")


def test_new_rows_after_compaction_are_read_from_the_tail(lake, offsets, tmp_path):
    first, second = messy_rollout("r1")
    offsets.write(lake, first + sample_rollout("r2"))
    refresh(lake)
    offsets.write(lake, second + sample_rollout("r3"))  # keyed retries, replays and a late end after compaction
    got = same(lake, tmp_path, "+tail")
    assert [r["rollout_id"] for r in got["rollouts"]] == ["r1", "r2", "r3"]
    result = refresh(lake)
    assert (result.incremental, result.rollouts) == (True, 2)  # r1 and r3: r2 untouched
    assert compacted_rows(lake) == tables_part(got)
    assert same(lake, tmp_path, "compacted") == got


def test_nothing_new_recomputes_nothing(lake, offsets, tmp_path):
    offsets.write(lake, sample_rollout("r1"))
    refresh(lake)
    result = refresh(lake)
    assert (result.incremental, result.rollouts, result.calls) == (True, 0, 0)
    same(lake, tmp_path, "compacted")


def test_a_duplicate_after_compaction_collapses_the_same_way(lake, offsets, tmp_path):
    events = sample_rollout("r1")
    offsets.write(lake, events)
    refresh(lake)
    request, response = events[1], events[2]
    retried = event("llm.request", {"call_id": "c1", "model": "late", "prompt_token_ids": [9]}, seq=0)
    offsets.write(lake, [request, response, retried])  # a replay (same event ids) and a keyed retry ranked first
    got = same(lake, tmp_path, "+tail")
    assert [(c["call_id"], c["model"]) for c in got["calls"]] == [("c1", "late"), ("c2", "qwen")]
    refresh(lake)
    assert same(lake, tmp_path, "compacted") == got


def test_request_compacted_and_response_in_the_tail(lake, offsets, tmp_path):
    events = sample_rollout("r1")
    response = events[2]
    offsets.write(lake, [e for e in events if e is not response])
    refresh(lake)
    assert [c["has_response"] for c in same(lake, tmp_path, "compacted")["calls"]] == [False, True]
    offsets.write(lake, [response])
    got = same(lake, tmp_path, "+tail")
    assert [c["has_response"] for c in got["calls"]] == [True, True]
    assert got["rollouts"][0]["n_response_tokens"] == 5


def test_response_compacted_and_request_in_the_tail(lake, offsets, tmp_path):
    events = sample_rollout("r1")
    request = events[5]
    offsets.write(lake, [e for e in events if e is not request])
    refresh(lake)
    assert [c["call_id"] for c in same(lake, tmp_path, "compacted")["calls"]] == ["c1"]
    offsets.write(lake, [request])
    got = same(lake, tmp_path, "+tail")
    assert [(c["call_id"], c["text"]) for c in got["calls"]] == [("c1", "I will run the tests"), ("c2", "done")]


def test_a_late_reward_recomputes_its_rollout(lake, offsets, tmp_path):
    offsets.write(lake, sample_rollout("r1") + sample_rollout("r2"))
    refresh(lake)
    offsets.write(lake, [event("reward", {"name": "pass", "value": 0.25}, seq=20, rollout_id="r2")])
    got = same(lake, tmp_path, "+tail")
    assert [(r["rollout_id"], r["reward"], r["n_rewards"]) for r in got["rollouts"]] == [
        ("r1", 1.5, 3), ("r2", 0.75, 4)]


def test_a_touched_rollout_spread_over_several_files_among_many_new_ones(lake, offsets, tmp_path):
    """The tail's rollouts are read through id ranges then list membership: an old rollout whose rows sit in
    several files, and more new rollouts than ranges (neighbours share one range), all recomputed whole."""
    first, second = messy_rollout("r1")
    offsets.write(lake, first)
    offsets.write(lake, sample_rollout("r2"))
    offsets.write(lake, second)  # r1's rows in the first and third file of each typed table
    refresh(lake)
    new = [e for n in range(20) for e in sample_rollout(f"r3-{n:02d}", task_id=f"t{n % 3}")]
    offsets.write(lake, new + [event("reward", {"name": "late", "value": 0.5}, seq=30, rollout_id="r1")])
    got = same(lake, tmp_path, "+tail")
    assert len(got["rollouts"]) == 22
    assert ("late", 0.5) in [(r["name"], r["value"]) for r in got["rollouts"][0]["rewards"]]
    plan = run_query(lake, "EXPLAIN ANALYZE SELECT count(*) FROM rollouts").to_pylist()  # profiling the scan
    assert plan  # of the filtered typed tables must not fail (a delta extension bug did with some filters)


def test_a_tail_too_long_reads_the_typed_tables(lake, offsets, tmp_path, monkeypatch):
    offsets.write(lake, sample_rollout("r1"))
    refresh(lake)
    offsets.write(lake, sample_rollout("r2"))
    monkeypatch.setattr(prejoin, "MAX_TOUCHED", 0)
    same(lake, tmp_path, "typed")


@pytest.mark.parametrize("bound, kinds", [
    (500, {"llm_calls_rows": "BASE TABLE", "rollouts_rows": "BASE TABLE", "tool_steps_rows": "BASE TABLE"}),
    (0, {"llm_calls": "VIEW", "llm_requests": "VIEW", "llm_responses": "VIEW", "rollouts": "VIEW"}),
])
def test_a_tail_is_copied_into_the_connection_only_up_to_a_bound(lake, offsets, tmp_path, monkeypatch, bound, kinds):
    """A tail's rollouts are recomputed once per connection while few (the views' rows kept, the typed rows they
    came from dropped); past ``MAX_MATERIALIZED`` rollouts (token lists in memory at every connect) they are
    filtered views, read by each query: the same answers either way."""
    offsets.write(lake, sample_rollout("r1"))
    refresh(lake)
    offsets.write(lake, sample_rollout("r2"))
    monkeypatch.setattr(prejoin, "MAX_MATERIALIZED", bound)
    same(lake, tmp_path, "+tail")
    con = connect(lake)
    try:
        found = dict(con.execute("SELECT table_name, table_type FROM information_schema.tables "
                                 "WHERE table_schema = '_fresh'").fetchall())
    finally:
        con.close()
    assert {name: found.get(name) for name in kinds} == kinds
    if bound:
        assert set(found) == set(kinds), "the typed rows and views the tail's rows came from are dropped"


def fresh_kinds(lake: Lake, **options: Any) -> dict[str, str]:
    """Schema ``_fresh`` of a connection: name -> VIEW or BASE TABLE."""
    con = connect(lake, **options)
    try:
        return dict(con.execute("SELECT table_name, table_type FROM information_schema.tables "
                                "WHERE table_schema = '_fresh'").fetchall())
    finally:
        con.close()


def test_a_one_query_connection_copies_nothing_at_connect(lake, offsets, tmp_path, monkeypatch):
    """``run_query`` answers one statement: the tail's rollouts are recomputed inside it (views), never copied into
    the connection first; a kept connection (``connect``'s default) copies them once: the same answers."""
    offsets.write(lake, sample_rollout("r1"))
    refresh(lake)
    offsets.write(lake, sample_rollout("r2"))
    assert set(fresh_kinds(lake, one_query=True).values()) == {"VIEW"}
    assert set(fresh_kinds(lake).values()) == {"BASE TABLE"}
    kept = connect(lake, sandbox=True)
    try:
        kept_answers = {name: kept.execute(sql).to_arrow_table().to_pylist() for name, sql in QUERIES.items()}
    finally:
        kept.close()

    def copied(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a one-query connection copied the tail at connect")

    with monkeypatch.context() as patched:
        patched.setattr(prejoin, "_materialize_fresh", copied)
        one_query = answers(lake)
    assert one_query == kept_answers == same(lake, tmp_path, "+tail")


def test_a_forgotten_rollout_leaves_the_compacted_tables(lake, offsets, tmp_path):
    offsets.write(lake, sample_rollout("r1") + sample_rollout("r2"))
    refresh(lake)
    forget(lake, ForgetRequest(rollouts=("r1",)))
    assert {r["rollout_id"] for rows in compacted_rows(lake).values() for r in rows} == {"r2"}
    # the delete rewrote files, but their rows are all at or before the marked offsets: nothing to recompute
    assert [r["rollout_id"] for r in same(lake, tmp_path, "compacted")["rollouts"]] == ["r2"]
    assert refresh(lake).rollouts == 0
    assert [r["rollout_id"] for r in same(lake, tmp_path, "compacted")["rollouts"]] == ["r2"]


def test_rows_that_arrived_before_a_forget_stay_in_the_views(lake, offsets, tmp_path):
    """forget deletes the log entries up to the version before it: the entry after the marks is gone then, yet the
    rows those commits added are still the tail."""
    offsets.write(lake, sample_rollout("r1"))
    refresh(lake)
    offsets.write(lake, sample_rollout("r2"))
    offsets.write(lake, sample_rollout("r3"))
    forget(lake, ForgetRequest(rollouts=("r1",)))
    assert [r["rollout_id"] for r in same(lake, tmp_path, "+tail")["rollouts"]] == ["r2", "r3"]


def test_retention_reaches_the_compacted_tables(lake, offsets, tmp_path):
    offsets.write(lake, sample_rollout("r1", tenant="acme") + sample_rollout("r2"))
    refresh(lake)
    apply_retention(lake, RetentionPolicy.parse({"acme": 1}), clock=lambda: T0 + timedelta(days=2))
    assert {r["rollout_id"] for rows in compacted_rows(lake).values() for r in rows} == {"r2"}
    assert [r["rollout_id"] for r in same(lake, tmp_path, "compacted")["rollouts"]] == ["r2"]


def test_rebuild_resets_what_the_tables_cover(lake, offsets, tmp_path):
    offsets.write(lake, sample_rollout("r1"))
    refresh(lake)
    before = answers(lake)
    rebuild_typed_tables(lake)
    assert lake.read(COMPACTION_MARKS_TABLE).num_rows == 0
    assert same(lake, tmp_path, "typed") == before
    assert refresh(lake).incremental is False  # the next compaction writes the tables whole again
    assert same(lake, tmp_path, "compacted") == before


def test_compact_refreshes_after_it_optimizes(lake, offsets, tmp_path):
    offsets.write(lake, sample_rollout("r1"))
    offsets.write(lake, sample_rollout("r2"))
    compact(lake)
    same(lake, tmp_path, "compacted")  # the marks name the optimized versions: nothing past them


def test_the_views_keep_their_column_types(lake, offsets):
    first, second = messy_rollout("r1")
    offsets.write(lake, first + second + sample_rollout("r2"))

    def types() -> list[tuple]:
        con = connect(lake)
        try:
            return [con.execute(f"DESCRIBE {view}").fetchall() for view in ("llm_calls", "tool_steps", "rollouts")]
        finally:
            con.close()

    before = types()
    refresh(lake)
    assert path_taken(lake) == "compacted"
    assert types() == before


def test_tail_files_rewritten_and_vacuumed_before_the_next_refresh(lake, offsets, tmp_path):
    offsets.write(lake, sample_rollout("r1"))
    refresh(lake)
    offsets.write(lake, sample_rollout("r2"))
    offsets.write(lake, sample_rollout("r3"))
    compact(lake, tables=["llm_requests", "rollout_starts"], vacuum_retention=timedelta(0))  # tail files gone
    same(lake, tmp_path, "+tail")  # the tail found by the marked offsets instead
    compact(lake, vacuum_retention=timedelta(0))
    assert [r["rollout_id"] for r in same(lake, tmp_path, "compacted")["rollouts"]] == ["r1", "r2", "r3"]


def test_sql_knows_which_views_the_prejoin_serves():
    """store.sql loads store.prejoin only for these views: a view added to PREJOINED must be named there too."""
    from store.sql import PREJOINED_VIEW_NAMES

    assert set(PREJOINED_VIEW_NAMES) == set(prejoin.PREJOINED)


def test_a_reader_racing_a_whole_rewrite_never_sees_a_half_written_table(lake, offsets, tmp_path, monkeypatch):
    """The marks read, then (before the reader attaches the tables) a whole rewrite empties them and writes its
    first bucket: the reader must not pair the old marks with that table."""
    for n in range(3):
        offsets.write(lake, sample_rollout(f"r{n}"))
    compact(lake, vacuum_retention=timedelta(0))
    expected = raw_answers(lake, tmp_path)
    read_marks, raced = prejoin.read_marks, []

    def racing_read_marks(con, lake_):
        marks = read_marks(con, lake_)
        if not raced:
            raced.append(True)
            prejoin.reset(lake_)  # what _write_whole does first, then its first bucket: one rollout only
            partial = run_query(lake_, f"SELECT * FROM {COMPACTED_ROLLOUTS_TABLE} WHERE rollout_id = 'r0'")
            prejoin._append(lake_, COMPACTED_ROLLOUTS_TABLE, partial, mode="overwrite")
        return marks

    monkeypatch.setattr(prejoin, "read_marks", racing_read_marks)
    assert run_query(lake, QUERIES["rollouts"]).to_pylist() == expected["rollouts"]
    assert raced


@pytest.mark.parametrize("where", ["compacted", "tail only", "tail only, s3"])
def test_a_forget_during_a_refresh_stays_forgotten(where, lake, tmp_path, monkeypatch, request):
    """A refresh read r1's typed rows, then an operator's forget of r1 committed, then the refresh wrote: its commits
    are made against the pre-joined tables as they were before it read, so they lose to the forget (its delete where
    r1 was compacted and a late reward put it in the tail; its fence where r1 is only in the tail and the pre-joined
    tables hold no row to delete) and the refresh starts again, instead of writing r1 back where the marks cover it."""
    if where.endswith("s3"):
        lake = request.getfixturevalue("s3_lake")
    offsets = Offsets()
    offsets.write(lake, sample_rollout("r2") + ([] if where.startswith("tail") else sample_rollout("r1")))
    refresh(lake)
    offsets.write(lake, sample_rollout("r1") if where.startswith("tail") else
                  [event("reward", {"name": "late", "value": 1.0}, seq=11, rollout_id="r1")])
    append, forgotten = prejoin._append, []

    def forget_meanwhile(lake_, table, data, *, mode, predicate=None):
        if predicate is not None and not forgotten:  # the typed rows are read; the forget runs now
            forgotten.append(forget(lake, ForgetRequest(rollouts=("r1",))))
        return append(lake_, table, data, mode=mode, predicate=predicate)

    monkeypatch.setattr(prejoin, "_append", forget_meanwhile)
    refresh(lake)
    assert forgotten
    for view in ("llm_calls", "rollouts"):
        left = run_query(lake, f"SELECT DISTINCT rollout_id FROM {view} ORDER BY 1").column("rollout_id").to_pylist()
        assert left == ["r2"], view
    if not where.endswith("s3"):
        monkeypatch.setattr(prejoin, "_append", append)
        refresh(lake)
        assert answers(lake) == raw_answers(lake, tmp_path)


def test_a_forget_before_a_refresh_reads_the_typed_rows_starts_it_again(lake, tmp_path, monkeypatch):
    """A forget that commits after the refresh pinned the typed tables but before it read them vacuums the files that
    snapshot lists and drops its log entries: the refresh's read fails, and it starts again (not a crash)."""
    offsets = Offsets()
    offsets.write(lake, sample_rollout("r1") + sample_rollout("r2"))
    refresh(lake)
    offsets.write(lake, [event("reward", {"name": "late", "value": 1.0}, seq=11, rollout_id="r1")])
    define, forgotten = prejoin.define_fresh, []

    def forget_meanwhile(con, statements, where, **options):
        if not forgotten:
            forgotten.append(forget(lake, ForgetRequest(rollouts=("r1",))))
        return define(con, statements, where, **options)

    monkeypatch.setattr(prejoin, "define_fresh", forget_meanwhile)
    refresh(lake)
    assert forgotten
    assert answers(lake) == raw_answers(lake, tmp_path)
    assert run_query(lake, "SELECT DISTINCT rollout_id FROM rollouts").column("rollout_id").to_pylist() == ["r2"]


def test_two_whole_writes_at_once_leave_each_row_once(lake, offsets, tmp_path, monkeypatch):
    """B writes the tables whole between two of A's buckets (two schedulers, or a manual `trajlake compact`): each of
    A's buckets is committed on top of A's previous one, so A's next one conflicts and A starts again, instead of
    appending its later buckets to B's complete tables."""
    monkeypatch.setattr(prejoin, "BUCKET_CALLS", 3)
    offsets.write(lake, [e for r in ("r1", "r2", "r3", "r4") for e in sample_rollout(r)])
    append, other = prejoin._append, []

    def other_compaction_meanwhile(lake_, table, data, *, mode, predicate=None):
        if mode == "append" and not other:  # A wrote bucket 0 of its first table
            other.append(True)
            monkeypatch.setattr(prejoin, "_append", append)
            refresh(lake)  # B: no marks yet, so a whole write too
            monkeypatch.setattr(prejoin, "_append", other_compaction_meanwhile)
        return append(lake_, table, data, mode=mode, predicate=predicate)

    monkeypatch.setattr(prejoin, "_append", other_compaction_meanwhile)
    refresh(lake)
    assert other
    assert compacted_rows(lake) == tables_part(raw_answers(lake, tmp_path))
    assert answers(lake) == raw_answers(lake, tmp_path)


def test_a_reset_during_a_refresh_is_not_written_over(lake, offsets, tmp_path, monkeypatch):
    """`trajlake rebuild` (or `ingest --recover`) moves the marks while a refresh runs: the refresh's marks are
    committed on top of the marks it read, so they lose to the reset and the refresh starts again (here: whole, as
    after any reset) instead of writing its incremental marks over the reset."""
    offsets.write(lake, sample_rollout("r1") + sample_rollout("r2"))
    refresh(lake)
    offsets.write(lake, sample_rollout("r9"))  # a tail, so the refresh has work
    touched, raced = prejoin._write_touched, []

    def reset_meanwhile(*args, **kwargs):
        if not raced:
            raced.append(True)
            prejoin.reset(lake)
        return touched(*args, **kwargs)

    monkeypatch.setattr(prejoin, "_write_touched", reset_meanwhile)
    assert not refresh(lake).incremental
    assert raced
    assert answers(lake) == raw_answers(lake, tmp_path)


@pytest.mark.parametrize("rollout_id", ["r\x00x", "r" + "\x00" * 499], ids=["one NUL", "499 NULs"])
def test_a_rollout_id_with_nul_characters_breaks_no_query(rollout_id, lake, tmp_path):
    """The contract lets an id hold any character (up to 500): DuckDB's and delta-rs's parsers end a quoted literal at
    NUL, and a chain of one `||` per NUL passed DuckDB's expression depth limit (1000)."""
    offsets = Offsets()
    offsets.write(lake, sample_rollout("r1"))
    refresh(lake)
    offsets.write(lake, sample_rollout(rollout_id))
    assert answers(lake) == raw_answers(lake, tmp_path)
    refresh(lake)
    assert answers(lake) == raw_answers(lake, tmp_path)


def test_a_forget_whose_fence_loses_to_a_concurrent_commit_still_forgets(lake, offsets, monkeypatch):
    """forget's fence (a metadata commit) fails on any commit that lands between its load and its commit (a refresh's
    rewrite, another forget's fence): it loads the table again and fences again."""
    offsets.write(lake, sample_rollout("r1") + sample_rollout("r2"))
    refresh(lake)
    real_table, inside, raced = Lake.table, [], []

    def table(self, name, **options):
        handle = real_table(self, name, **options)
        if inside and name == COMPACTED_LLM_CALLS_TABLE and not raced:  # a refresh's rewrite lands meanwhile
            raced.append(True)
            write_deltalake(self.uri(name), real_table(self, name).to_pyarrow_table(), mode="overwrite",
                            storage_options=dict(self.storage_options))
        return handle

    real_fence = forget_module.fence

    def fence(lake_, name, reason):
        inside.append(True)
        try:
            return real_fence(lake_, name, reason)
        finally:
            inside.pop()

    monkeypatch.setattr(Lake, "table", table)
    monkeypatch.setattr(forget_module, "fence", fence)
    forget(lake, ForgetRequest(rollouts=("r1",)))
    assert raced
    left = run_query(lake, "SELECT DISTINCT rollout_id FROM llm_calls ORDER BY 1").column("rollout_id").to_pylist()
    assert left == ["r2"]


def test_a_tail_past_the_bound_with_its_log_entries_gone_is_written_whole(lake, offsets, tmp_path, monkeypatch):
    """After `ingest --recover` (a rewound partition marked -1) a forget drops the typed tables' log entries: the
    next refresh finds the tail by the marked offsets, every rollout of the partition. Past ``MAX_TOUCHED`` it writes
    the tables whole, bucket by bucket, instead of one rewrite with an IN list of every id."""
    monkeypatch.setattr(prejoin, "MAX_TOUCHED", 5)
    offsets.write(lake, [e for n in range(20) for e in sample_rollout(f"r{n:02d}")])
    refresh(lake)
    prejoin.rewind(lake, "trajlake.events", [0])
    offsets.write(lake, sample_rollout("new"))
    forget(lake, ForgetRequest(rollouts=("r00",)))
    assert not refresh(lake).incremental
    assert answers(lake) == raw_answers(lake, tmp_path)


def test_a_compaction_while_a_reader_connects_gives_one_lake_or_the_other(lake, offsets, monkeypatch):
    """A compaction lands after `connect` pinned the typed tables, before it attached the pre-joined ones: the marks
    were read first, so the reader sees they moved and keeps views.sql's views over its pinned typed tables; it never
    recomputes a rollout from typed rows older than the marks (r2 would vanish, r3 show)."""
    offsets.write(lake, sample_rollout("r1"))
    refresh(lake)
    real, raced = prejoin.prejoined_views, []

    def compaction_meanwhile(*args, **kwargs):
        if not raced:
            raced.append(True)
            offsets.write(lake, sample_rollout("r2") + sample_rollout("r3"))
            refresh(lake)
            offsets.write(lake, [event("reward", {"name": "late", "value": 1.0}, seq=11, rollout_id="r2")])
        return real(*args, **kwargs)

    monkeypatch.setattr(prejoin, "prejoined_views", compaction_meanwhile)
    got = run_query(lake, "SELECT DISTINCT rollout_id FROM rollouts ORDER BY 1").column("rollout_id").to_pylist()
    assert raced
    assert got in (["r1"], ["r1", "r2", "r3"])


def test_a_whole_rewrite_of_an_unchanged_lake_writes_marks_a_reader_tells_apart(lake, offsets):
    """A pre-joined table missing (a lake compacted before it existed) and nothing new: the refresh rewrites whole and
    writes the same versions and offsets again. A reader compares the marks before and after attaching the tables
    (a half-written table in between): they must differ, so they carry when they were written."""
    offsets.write(lake, sample_rollout("r1"))
    refresh(lake)
    con = connect(lake, tables=[], views=set())
    before = prejoin.read_marks(con, lake)
    shutil.rmtree(Path(lake.root) / COMPACTED_TOOL_STEPS_TABLE)
    assert not refresh(lake).incremental
    after = prejoin.read_marks(con, lake)
    assert (before.versions, before.offsets) == (after.versions, after.offsets)
    assert before != after


def test_a_refresh_of_an_unchanged_lake_reads_no_log_entry_and_commits_nothing(lake, offsets, monkeypatch):
    """The scheduler refreshes every 5 minutes: with nothing new, one probe per typed table and no commit (against
    moto it read every entry since each table's checkpoint and committed the same marks: ~37 s, ~5,500 requests)."""
    offsets.write(lake, sample_rollout("r1") + sample_rollout("r2"))
    refresh(lake)
    marks_version = lake.version(COMPACTION_MARKS_TABLE)
    reads, read_file = [], Lake.read_file
    monkeypatch.setattr(Lake, "read_file", lambda self, path: reads.append(path) or read_file(self, path))
    assert refresh(lake) == prejoin.Prejoined(True, 0, 0, 0)
    assert [path for path in reads if path.endswith(".json")] == []
    assert lake.version(COMPACTION_MARKS_TABLE) == marks_version


def _write_marked(lake: Lake, events: list, first_offset: int) -> None:
    """Events into the typed tables as the ingester commits them: rows and its exactly-once marker in one commit."""
    from schemas.tables import INGESTED_TABLES
    from store.commit import marker_app_id
    from store.event_rows import KafkaCoordinates, events_table, typed_tables

    rows = events_table(events, [KafkaCoordinates("trajlake.events", 0, first_offset + i) for i in range(len(events))])
    marker = {marker_app_id("g", "trajlake.events", 0): first_offset + len(events) - 1}
    for name, batch in {"events": rows, **typed_tables(rows)}.items():
        lake.append(name, batch, schema=INGESTED_TABLES[name], markers=marker)


def test_a_recover_during_a_whole_write_keeps_the_new_logs_rows_in_the_views(lake, monkeypatch):
    """`ingest --recover` rewinds the markers, then the marks, while a refresh writes whole (after a reset; 9 min on
    the 1M-call lake): the marks are empty then, so the rewind's overwrite changes nothing a commit checks; its
    metadata commit makes the refresh's marks (the old log's offsets) conflict, and the refresh starts again."""
    from schemas.tables import INGESTED_TABLES
    from store.commit import marker_app_id

    _write_marked(lake, [e for n in range(5) for e in sample_rollout(f"old{n}")], 0)  # old log: offsets 0..54
    refresh(lake)
    prejoin.reset(lake)
    bounds, raced = prejoin._bucket_bounds, []

    def recover_meanwhile(*args, **kwargs):
        if not raced:
            raced.append(True)
            for name in INGESTED_TABLES:  # the ingester's MarkedTable.rewind: markers -1 in every table
                lake.append(name, INGESTED_TABLES[name].empty_table(),
                            markers={marker_app_id("g", "trajlake.events", 0): -1})
            prejoin.rewind(lake, "trajlake.events", [0])
            _write_marked(lake, sample_rollout("new"), 0)  # the recreated topic's log: offsets 0..10
        return bounds(*args, **kwargs)

    monkeypatch.setattr(prejoin, "_bucket_bounds", recover_meanwhile)
    refresh(lake)
    assert raced
    _write_marked(lake, sample_rollout("next"), 11)  # the new log goes on, below the old log's offsets
    ids = run_query(lake, "SELECT rollout_id FROM rollouts ORDER BY 1").column("rollout_id").to_pylist()
    assert ids == ["new", "next", "old0", "old1", "old2", "old3", "old4"]


def test_deleted_since_reads_the_new_log_entries_without_loading_a_table(lake, offsets, monkeypatch):
    """A delete (a forget) after the pinned versions is found in the new entries' commitInfo; appends are not
    deletes; ``any_commit`` counts any. No table load (against moto, 7 tables: 14 s and 2,877 requests by history)."""
    from schemas.tables import LLM_REQUESTS_TABLE

    offsets.write(lake, sample_rollout("r1") + sample_rollout("r2"))
    pinned = {source: lake.version(source) for source in prejoin.SOURCES}
    monkeypatch.setattr(Lake, "table", lambda *args, **kwargs: pytest.fail("a table was loaded"))
    assert prejoin._deleted_since(lake, pinned) is None
    monkeypatch.undo()
    offsets.write(lake, sample_rollout("r3"))
    lake.table(LLM_REQUESTS_TABLE).delete("rollout_id = 'r1'")
    monkeypatch.setattr(Lake, "table", lambda *args, **kwargs: pytest.fail("a table was loaded"))
    assert prejoin._deleted_since(lake, {s: v for s, v in pinned.items() if s != LLM_REQUESTS_TABLE}) is None
    assert prejoin._deleted_since(lake, {s: v for s, v in pinned.items() if s != LLM_REQUESTS_TABLE},
                                  any_commit=True) is not None
    assert prejoin._deleted_since(lake, pinned) == LLM_REQUESTS_TABLE


def test_deleted_since_counts_a_log_entry_it_cannot_read_as_a_delete(lake, offsets, monkeypatch):
    """An entry that is there but unreadable (an object store's 503) is not the end of the log: a forget's delete
    behind it must not be missed, or a refresh could write the forgotten rollout back (review4)."""
    from schemas.tables import LLM_REQUESTS_TABLE

    offsets.write(lake, sample_rollout("r1"))
    pinned = {LLM_REQUESTS_TABLE: lake.version(LLM_REQUESTS_TABLE)}
    offsets.write(lake, sample_rollout("r2"))
    lake.table(LLM_REQUESTS_TABLE).delete("rollout_id = 'r1'")
    unreadable = f"{LLM_REQUESTS_TABLE}/_delta_log/{lake.version(LLM_REQUESTS_TABLE):020d}.json"  # the delete
    real = Lake.read_file
    monkeypatch.setattr(Lake, "read_file", lambda self, path: None if path == unreadable else real(self, path))
    assert prejoin._deleted_since(lake, pinned) == LLM_REQUESTS_TABLE

def test_a_refresh_pinned_inside_a_forget_starts_again(lake, offsets):
    """A refresh that pinned a typed table after a forget's delete and before its new checkpoint (which drops the
    entries and checkpoints before the forget) cannot read the ingester's markers as of that version: it starts
    again (``_Raced``) instead of marking the offsets uncapped."""
    from schemas.tables import LLM_REQUESTS_TABLE
    from store.forget import _drop_log_history

    _write_marked(lake, sample_rollout("r1"), 0)
    _write_marked(lake, sample_rollout("r2"), 11)
    before = lake.version(LLM_REQUESTS_TABLE)
    lake.table(LLM_REQUESTS_TABLE).delete("rollout_id = 'r1'")  # the forget's delete: the refresh pins this version
    _write_marked(lake, sample_rollout("r3"), 22)
    _drop_log_history(lake, LLM_REQUESTS_TABLE, through=before)
    with pytest.raises(prejoin._Raced, match="cannot be read"):
        prejoin._capped(lake, LLM_REQUESTS_TABLE, before + 1, {("trajlake.events", 0): 21})
    assert prejoin._capped(lake, LLM_REQUESTS_TABLE, lake.version(LLM_REQUESTS_TABLE),
                           {("trajlake.events", 0): 40}) == {("trajlake.events", 0): 32}


def test_a_refresh_of_a_short_tail_probes_the_typed_tables_versions(lake, offsets, monkeypatch):
    """The versions a refresh pins are probed from the marked ones (a file stat per new entry), not loaded (a full
    log load each: ~100 GETs on S3); a table that moved more than ``PROBED_COMMITS`` since, or never marked, loads."""
    from schemas.tables import LLM_REQUESTS_TABLE

    offsets.write(lake, sample_rollout("r1"))
    refresh(lake)
    offsets.write(lake, sample_rollout("r2"))
    loads, version = [], prejoin._version
    monkeypatch.setattr(prejoin, "_version", lambda lake, table: loads.append(table) or version(lake, table))
    assert refresh(lake).rollouts == 1
    assert loads == []
    marked = lake.version(LLM_REQUESTS_TABLE)
    monkeypatch.setattr(prejoin, "PROBED_COMMITS", 1)
    offsets.write(lake, sample_rollout("r3"))
    offsets.write(lake, sample_rollout("r4"))
    assert prejoin._latest(lake, LLM_REQUESTS_TABLE, marked) == marked + 2
    assert prejoin._latest(lake, LLM_REQUESTS_TABLE, -1) == marked + 2
    assert loads == [LLM_REQUESTS_TABLE, LLM_REQUESTS_TABLE]
