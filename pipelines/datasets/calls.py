"""Which LLM calls of the selected rollouts are trained, and reading their tokens.

A call is a request joined with its response (first response by seq for a
call_id). Each call gets one status, decided here and nowhere else:

- ``duplicate``: another call of the rollout has the same ``idempotency_key``
  or the same ``call_id`` (retries): only one of them is trained, preferring
  one with a usable response, then the earliest.
- ``no_response``: no llm.response arrived (yet).
- ``error``: the response carries an error.
- ``non_engine``: the tokens were not sampled by the engine (token_source is
  not ``engine``, or prompt/response token ids are missing); trained only with
  ``allow_non_engine`` when both token lists are present (missing logprobs
  are then 0).
- ``malformed``: engine tokens whose logprobs are missing or not one per
  response token (old logprobs would be wrong): never trained.
- ``unresolved_prefix``: the request carries a prefix reference
  (``extends_call_id``) whose chain cannot be followed in the pinned tables:
  a referenced call is missing (not ingested yet, or forgotten), has no
  prompt ids, or is shorter than ``extends_tokens``. Skipped and counted, never
  guessed; a later build that sees the missing call trains it.
- ``ok``: trained.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from pipelines.datasets.sources import Snapshot
from schemas.tables import LLM_REQUESTS_TABLE, LLM_RESPONSES_TABLE
from store.lake import Lake

# Token counts come from the scalar columns the ingester fills beside the
# token lists (n_prompt_tokens = the full prompt's length, prefix references
# included; NULL when there are no ids), so this pass never decodes a prompt;
# the merger checks them (extends_call_id here: of prefix references only, not
# of a call that references only messages). A prefix reference resolves when its chain reaches a
# call without one, each link naming a call of the rollout (its call_id row)
# long enough for extends_tokens: decided here on counts alone.
CALL_INDEX = f"""
CREATE OR REPLACE TEMP TABLE call_index AS
WITH RECURSIVE req AS (
    SELECT rollout_id, call_id, seq, event_id AS req_event_id, idempotency_key,
           n_prompt_tokens IS NOT NULL AS has_prompt, coalesce(n_prompt_tokens, 0) AS n_prompt,
           CASE WHEN extends_tokens IS NOT NULL THEN extends_call_id END AS extends_call_id, extends_tokens
    FROM {LLM_REQUESTS_TABLE} SEMI JOIN usable USING (tenant, rollout_id)),
resp AS (
    SELECT * FROM (
        SELECT rollout_id, call_id, event_id AS resp_event_id, token_source, error,
               n_response_tokens IS NOT NULL AS has_response, coalesce(n_response_tokens, 0) AS n_response,
               CASE WHEN logprobs IS NULL THEN token_source = 'engine'
                    ELSE len(logprobs) <> coalesce(n_response_tokens, -1) END AS bad_logprobs,
               row_number() OVER (PARTITION BY rollout_id, call_id ORDER BY seq, event_id) AS k
        FROM {LLM_RESPONSES_TABLE} SEMI JOIN usable USING (tenant, rollout_id))
    WHERE k = 1),
calls AS (
    SELECT req.*, resp.resp_event_id, resp.n_response,
           CASE WHEN resp.resp_event_id IS NULL THEN 'no_response'
                WHEN resp.error IS NOT NULL THEN 'error'
                WHEN req.has_prompt AND resp.has_response AND resp.bad_logprobs
                     AND (resp.token_source = 'engine' OR $allow) THEN 'malformed'
                WHEN req.has_prompt AND resp.has_response AND (resp.token_source = 'engine' OR $allow) THEN 'ok'
                ELSE 'non_engine' END AS base_status
    FROM req LEFT JOIN resp ON req.rollout_id = resp.rollout_id AND req.call_id = resp.call_id),
ranked AS (
    SELECT *,
           row_number() OVER (PARTITION BY rollout_id, coalesce(idempotency_key, 'call:' || call_id)
                              ORDER BY base_status = 'ok' DESC, seq, req_event_id) AS key_rank,
           row_number() OVER (PARTITION BY rollout_id, call_id
                              ORDER BY base_status = 'ok' DESC, seq, req_event_id) AS id_rank
    FROM calls),
resolved(rollout_id, call_id) AS (
    SELECT rollout_id, call_id FROM ranked WHERE id_rank = 1 AND extends_call_id IS NULL AND has_prompt
    UNION
    SELECT c.rollout_id, c.call_id
    FROM resolved AS r
    JOIN ranked AS p ON p.rollout_id = r.rollout_id AND p.call_id = r.call_id AND p.id_rank = 1
    JOIN ranked AS c ON c.rollout_id = r.rollout_id AND c.extends_call_id = r.call_id AND c.id_rank = 1
    WHERE c.has_prompt AND c.extends_tokens <= p.n_prompt + coalesce(p.n_response, 0))
SELECT rollout_id, call_id, seq, req_event_id, resp_event_id, n_prompt, n_response, extends_call_id, extends_tokens,
       id_rank = 1 AS call_row,
       CASE WHEN key_rank > 1 OR id_rank > 1 THEN 'duplicate'
            WHEN base_status = 'ok' AND extends_call_id IS NOT NULL AND chain.call_id IS NULL THEN 'unresolved_prefix'
            ELSE base_status END AS status
FROM ranked LEFT JOIN resolved AS chain USING (rollout_id, call_id)
"""

CALL_STATUSES = ("ok", "duplicate", "no_response", "error", "non_engine", "malformed", "unresolved_prefix")


def index_calls(con: duckdb.DuckDBPyConnection, *, allow_non_engine: bool) -> dict[str, int]:
    """Build ``call_index`` for the rollouts in temp table ``usable``; return calls per status."""
    con.execute(CALL_INDEX, {"allow": allow_non_engine})
    counts = dict(con.execute("SELECT status, count(*) FROM call_index GROUP BY status").fetchall())
    return {status: int(counts.get(status, 0)) for status in CALL_STATUSES}


def trained_tokens_per_rollout(con: duckdb.DuckDBPyConnection) -> pa.Table:
    """rollout_id, trained (response) tokens, total tokens read, trained call count: for ok calls."""
    return con.execute(
        """SELECT rollout_id, sum(n_response)::BIGINT AS trained_tokens,
                  sum(n_prompt + n_response)::BIGINT AS read_tokens
           FROM call_index WHERE status = 'ok' GROUP BY rollout_id ORDER BY rollout_id"""
    ).to_arrow_table()


@dataclass(frozen=True)
class BatchTokens:
    """The trained calls of one batch of rollouts and the token rows they point at."""

    calls: pa.Table
    """rollout_id, call_id, seq, req_event_id, resp_event_id; sorted by rollout, seq."""
    requests: pa.Table
    """event_id, span_id, tokenizer, chat_template_hash, prompt_token_ids (files that hold the id range)."""
    responses: pa.Table
    """event_id, response_token_ids, logprobs, policy_version (files that hold the id range)."""
    links: pa.Table
    """rollout_id, call_id, req_event_id, resp_event_id, extends_call_id, extends_tokens: every call of the
    batch's rollouts whose ok calls carry prefix references (what resolving their full prompts reads)."""


class TokenTables:
    """The pinned ``llm_requests`` / ``llm_responses``, read by rollout_id range.

    Token lists are read with Arrow's own Parquet reader: DuckDB decodes as
    fast but converting its lists to Arrow measured ~3x the CPU of a direct
    Arrow read. Files are pruned by their rollout_id statistics.
    """

    def __init__(self, lake: Lake, snapshot: Snapshot) -> None:
        self.requests = DecodedFiles(
            lake.dataset(LLM_REQUESTS_TABLE, version=snapshot.versions[LLM_REQUESTS_TABLE], prune_on=["rollout_id"]),
            ["event_id", "span_id", "tokenizer", "chat_template_hash", "prompt_token_ids"],
        )
        self.responses = DecodedFiles(
            lake.dataset(LLM_RESPONSES_TABLE, version=snapshot.versions[LLM_RESPONSES_TABLE], prune_on=["rollout_id"]),
            ["event_id", "response_token_ids", "logprobs", "policy_version"],
        )


class DecodedFiles:
    """The files that may hold a rollout_id range; a file is decoded once while ranges advance through sorted ids.

    A file holds a span of rollout ids that several batches share: filtering
    the dataset per batch decoded it once per batch (a build with
    ``batch_tokens`` 200k took 3.7x as long as one with 4M). A decoded file is
    kept only while a later range can still need it. Files come back whole,
    not filtered to the range: filtering copied every token list once more
    (a third of the read's CPU, measured); callers pick their rows by event_id.
    """

    def __init__(self, dataset: ds.Dataset, columns: list[str]) -> None:
        self._dataset, self._columns = dataset, columns
        self._decoded: dict[str, pa.Table] = {}

    def read(self, first: str, last: str) -> pa.Table:
        """Every row of the files whose rollout_id statistics overlap ``first..last``; cheapest in ascending ranges."""
        in_range = (pc.field("rollout_id") >= first) & (pc.field("rollout_id") <= last)
        wanted = ["rollout_id", *(c for c in self._columns if c != "rollout_id")]
        pieces, kept = [], {}
        for fragment in self._dataset.get_fragments(filter=in_range):
            table = self._decoded.get(fragment.path)
            if table is None:
                table = fragment.to_table(schema=self._dataset.schema, columns=wanted)
            highest = pc.max(table["rollout_id"]).as_py()
            if highest is None or highest < first:
                continue  # the file's statistics overlap the range, its rows do not
            pieces.append(table.select(self._columns))
            if highest > last:
                kept[fragment.path] = table
        self._decoded = kept
        if not pieces:
            return self._dataset.schema.empty_table().select(self._columns)
        return pa.concat_tables(pieces)


class CallRows:
    """The ok calls of ``call_index`` and their prefix links, read in two queries for the whole build.

    Each batch takes its rows by slicing (both are sorted by rollout_id):
    two ``call_index`` queries per batch cost 0.2-0.3 s CPU at 1,600 rollouts
    (16 batches), more than reading the whole index once (~5 MB at 34k calls, sliced by one key per rollout).
    Read before the build closes its DuckDB connection: the streaming phase needs no SQL.
    """

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self.calls = con.execute(
            """SELECT rollout_id, call_id, seq, req_event_id, resp_event_id FROM call_index
               WHERE status = 'ok' ORDER BY rollout_id, seq, req_event_id"""
        ).to_arrow_table()
        """rollout_id, call_id, seq, req_event_id, resp_event_id of the ok calls, by rollout_id, seq, req_event_id."""
        self._links = con.execute(
            """SELECT rollout_id, call_id, req_event_id, resp_event_id, extends_call_id, extends_tokens
               FROM call_index WHERE call_row AND rollout_id IN (
                   SELECT rollout_id FROM call_index WHERE status = 'ok' AND extends_call_id IS NOT NULL)
               ORDER BY rollout_id, seq, req_event_id"""
        ).to_arrow_table()
        self._call_runs, self._link_runs = _Runs(self.calls), _Runs(self._links)

    def of(self, rollout_ids: list[str]) -> tuple[pa.Table, pa.Table]:
        """(calls, links) of ``rollout_ids`` (a sorted run of the plan's ids)."""
        wanted = pa.array(rollout_ids, pa.string())
        return self._call_runs.rows_of(rollout_ids, wanted), self._link_runs.rows_of(rollout_ids, wanted)


class _Runs:
    """A table sorted by rollout_id, sliced by rollout range: one key and one row range per rollout."""

    def __init__(self, table: pa.Table) -> None:
        self._table = table
        runs = pc.run_end_encode(table["rollout_id"].combine_chunks())
        self._keys = np.asarray(runs.values.to_pylist(), dtype=object)
        self._ends = np.concatenate(([0], runs.run_ends.to_numpy())).astype(np.int64)

    def rows_of(self, rollout_ids: list[str], wanted: pa.Array) -> pa.Table:
        """The rows whose rollout is one of ``rollout_ids`` (sorted); ``wanted``: the same ids as an array."""
        first = np.searchsorted(self._keys, rollout_ids[0], "left")
        last = np.searchsorted(self._keys, rollout_ids[-1], "right")
        lo, hi = int(self._ends[first]), int(self._ends[last])
        rows = self._table.slice(lo, hi - lo)
        return rows.filter(pc.is_in(rows["rollout_id"], value_set=wanted))  # a rollout in range outside the plan


def read_batch(rows: CallRows, tables: TokenTables, rollout_ids: list[str]) -> BatchTokens:
    """Tokens of the ok calls of ``rollout_ids`` (sorted).

    The token tables are read with a plain rollout_id range filter; calls
    are matched to token rows by event_id in Python (a SQL join of the token
    tables measured 2x slower).
    """
    calls, links = rows.of(rollout_ids)
    first, last = rollout_ids[0], rollout_ids[-1]
    return BatchTokens(calls, tables.requests.read(first, last), tables.responses.read(first, last), links)


def read_ahead(
    rows: CallRows, tables: TokenTables, batches: Iterable[list[str]]
) -> Iterator[tuple[list[str], BatchTokens]]:
    """Each batch of rollout ids with its tokens, the next batch read on a worker thread meanwhile.

    Arrow's Parquet decode releases the GIL, so reading batch n+1 overlaps
    merging and writing batch n: at most one batch more in memory. The
    caller holds the only reference to a batch's tokens (neither this
    generator nor a finished future keeps one), so it can free them early.
    """
    batches = iter(batches)
    current = next(batches, None)
    if current is None:
        return
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="trajlake-token-read") as pool:
        pending = [pool.submit(read_batch, rows, tables, current)]
        for following in batches:
            pending.append(pool.submit(read_batch, rows, tables, following))  # starts once batch n is read
            yield current, pending.pop(0).result()
            current = following
        yield current, pending.pop(0).result()


def iter_batches(rollout_ids: list[str], read_tokens: list[int], batch_tokens: int) -> Iterator[list[str]]:
    """Consecutive runs of rollout ids whose read tokens stay within ``batch_tokens`` (one rollout at least)."""
    batch: list[str] = []
    size = 0
    for rollout_id, n in zip(rollout_ids, read_tokens):
        if batch and size + n > batch_tokens:
            yield batch
            batch, size = [], 0
        batch.append(rollout_id)
        size += n
    if batch:
        yield batch
