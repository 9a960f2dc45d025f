"""``build_dataset``: rollouts of the lake -> one new version of ``datasets/NAME``.

Stages: pin the source tables, select rollouts and join rewards (SQL on
scalars), group advantages, index the trained calls (SQL on scalars), close
DuckDB, then stream batches of rollouts (bounded by ``batch_tokens``) through the merger
straight into Parquet files and one Delta overwrite commit, hashing rows as they are written.
Finally the lineage rows and the registry manifest are appended and a
``dataset.version`` event is published when a producer is given.
Options: a state-change-conditioned tool credit added to the rewards
(``pipelines.datasets.tool_credit``, reads ``tool_results`` too) and observation
datasets (``pipelines.datasets.observations``, one extra counting pass).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from kafka.errors import KafkaError

from pipelines.datasets.advantages import group_advantages, token_weights
from pipelines.datasets.calls import CallRows, TokenTables, index_calls, trained_tokens_per_rollout
from pipelines.datasets.config import BuildConfig
from pipelines.datasets.content_hash import ContentHash
from pipelines.datasets.observations import with_observed_tokens
from pipelines.datasets.publish import Producer, publish_version
from pipelines.datasets.registry import check_name, record_version
from pipelines.datasets.sample_files import write_version
from pipelines.datasets.samples import RolloutPlan, SampleStream
from pipelines.datasets.selection import select_rollouts
from pipelines.datasets.sources import SOURCE_TABLES, Snapshot, pinned_connection
from pipelines.datasets.tool_credit import add_tool_credit
from schemas.code_version import code_version
from schemas.tables import SAMPLES, TOOL_RESULTS_TABLE, dataset_table
from store.identity import lake_id
from store.lake import Lake
from schemas.errors import InputError

log = logging.getLogger(__name__)

Progress = Callable[[int, int], None]
"""Called with (rollouts merged so far, rollouts to merge)."""


class EmptyDataset(InputError):
    """The selection left no rollout with a reward and trained tokens."""


@dataclass(frozen=True)
class BuildResult:
    dataset: str
    version: int
    content_hash: str
    manifest: dict[str, Any]
    published: bool
    publish_error: str | None = None
    """Why the dataset.version event could not be sent (the version is committed regardless)."""


def build_dataset(
    lake: Lake,
    name: str,
    config: BuildConfig | None = None,
    *,
    producer: Producer | None = None,
    progress: Progress | None = None,
) -> BuildResult:
    """Build a new version of ``datasets/NAME`` and register it.

    >>> result = build_dataset(Lake("./lake"), "nightly", BuildConfig(advantage="mean"))  # doctest: +SKIP
    >>> result.manifest["merge"]["mismatches"]  # doctest: +SKIP
    """
    config = config or BuildConfig()
    check_name(name)
    snapshot = Snapshot.pin(lake, SOURCE_TABLES + ((TOOL_RESULTS_TABLE,) if config.tool_credit else ()))
    tables = TokenTables(lake, snapshot)
    passes = 2 if config.mask == "observations" else 1
    plan, counts, rows = _plan(lake, snapshot, tables, config, progress=_pass_progress(progress, 0, passes))
    stream = SampleStream(rows, tables, plan, config, progress=_pass_progress(progress, passes - 1, passes))
    content = ContentHash(config.identity())
    write_version(lake, dataset_table(name), stream.batches(), schema=SAMPLES, observe=content.update)
    lineage = _lineage(rows, plan, stream.samples_per_rollout)
    version = lake.version(dataset_table(name))
    manifest = _manifest(name, version, config, snapshot, counts, stream, content.hexdigest())
    record_version(lake, manifest, lineage)
    log.info("dataset built dataset=%s version=%s samples=%s hash=%s", name, version,
             stream.n_samples, manifest["content_hash"])
    published, publish_error = False, None
    if producer is not None:
        try:
            publish_version(producer, manifest, lake_id=lake_id(lake))
            published = True
        except (KafkaError, OSError) as exc:
            publish_error = f"{type(exc).__name__}: {exc}"
            log.warning("dataset.version not published dataset=%s version=%s error=%s", name, version, publish_error)
    return BuildResult(name, version, manifest["content_hash"], manifest, published, publish_error)


def _pass_progress(progress: Progress | None, index: int, passes: int) -> Progress | None:
    """Pass ``index`` of ``passes`` over the same rollouts, reported as one bar."""
    if progress is None:
        return None
    return lambda done, total: progress(index * total + done, passes * total)


def _plan(
    lake: Lake, snapshot: Snapshot, tables: TokenTables, config: BuildConfig, *, progress: Progress | None = None
) -> tuple[RolloutPlan, dict[str, Any], CallRows]:
    """Rollouts to merge with their reward, advantage and weight; counts of what was left out; the trained calls.

    The SQL runs on a DuckDB connection that is closed before any token is
    read: DuckDB keeps memory its queries used (~1.2-1.5 KB per call, mostly
    ``call_index``'s joins and windows) until the database closes, outside
    ``duckdb_memory()`` and glibc's counters; dropping the temp tables or
    ``malloc_trim`` returns none of it, lowering ``memory_limit`` about half.
    Held through the streaming phase it made the build's peak RSS grow with
    the number of calls (1.11-1.15x for 4x the input); closing returns it.
    """
    con = pinned_connection(lake, snapshot)
    try:
        rollouts, selected = select_rollouts(con, config.selection, config.reward_rule)
        tool_counts = None
        if config.tool_credit is not None:
            rollouts, tool_counts = add_tool_credit(con, rollouts, config.tool_credit)
        rewards = rollouts["reward"].to_numpy()
        adv = group_advantages(rewards, rollouts[config.group_by].to_numpy(zero_copy_only=False),
                               mode=config.advantage, epsilon=config.std_epsilon)
        keep = ~adv.degenerate if config.drop_degenerate else np.ones(len(rewards), dtype=bool)
        values = np.zeros(len(rewards)) if config.mask == "observations" else adv.values
        rollouts = rollouts.append_column("advantage", pa.array(values, pa.float64())).filter(pa.array(keep))
        joined, calls = _with_trained_tokens(con, rollouts, allow_non_engine=config.allow_non_engine)
        rows = CallRows(con)
    finally:
        con.close()
    loss_tokens = "trained_tokens"
    if config.mask == "observations":
        joined = with_observed_tokens(rows, tables, joined, batch_tokens=config.batch_tokens, progress=progress)
        loss_tokens = "observed_tokens"
    if joined.num_rows == 0:
        raise EmptyDataset(
            f"no rollout is left to train on: {selected['selected']} selected, {selected['without_reward']} "
            f"without a reward, trained calls {calls['ok']} of {sum(calls.values())} "
            f"(non-engine {calls['non_engine']}: see --allow-non-engine)"
            + (", none with an observation (a call extending an earlier one)" if config.mask == "observations" else "")
            + ". Widen the filters or wait for rewards."
        )
    weights = token_weights(joined[loss_tokens].to_numpy())
    plan = RolloutPlan.from_table(joined.append_column("token_weight", pa.array(weights, pa.float64())))
    counts = {
        "rollouts": {
            "selected": selected["selected"],
            "ambiguous_id": selected["ambiguous_id"],
            "without_reward": selected["without_reward"],
            "degenerate_dropped": int((~keep).sum()),
            "without_trained_tokens": int(keep.sum()) - joined.num_rows,
            "in_dataset": joined.num_rows,
        },
        "calls": calls,
        "groups": {
            "count": adv.n_groups,
            "singleton": adv.n_singleton_groups,
            "zero_std": adv.n_zero_std_groups,
            "degenerate_rollouts": int(adv.degenerate.sum()),
        },
    }
    if tool_counts is not None:
        counts["tool_credit"] = tool_counts
    return plan, counts, rows


def _with_trained_tokens(
    con: duckdb.DuckDBPyConnection, rollouts: pa.Table, *, allow_non_engine: bool
) -> tuple[pa.Table, dict[str, int]]:
    """Index the calls of ``rollouts``; the rollouts with trained tokens, joined with their token counts."""
    con.register("usable_arrow", rollouts.select(["tenant", "rollout_id"]))
    con.execute("CREATE OR REPLACE TEMP TABLE usable AS SELECT tenant, rollout_id FROM usable_arrow")
    con.unregister("usable_arrow")
    calls = index_calls(con, allow_non_engine=allow_non_engine)
    con.register("tokens_arrow", trained_tokens_per_rollout(con))
    con.register("rollouts_arrow", rollouts)
    joined = con.execute(
        """SELECT r.*, t.trained_tokens, t.read_tokens FROM rollouts_arrow r
           JOIN tokens_arrow t USING (rollout_id) WHERE t.trained_tokens > 0 ORDER BY r.rollout_id"""
    ).to_arrow_table()
    con.unregister("tokens_arrow")
    con.unregister("rollouts_arrow")
    return joined, calls


def _lineage(rows: CallRows, plan: RolloutPlan, samples_per_rollout: dict[str, int]) -> pa.Table:
    return pa.table(
        {
            "rollout_id": plan.rollout_ids,
            "task_id": plan.task_ids,
            "reward": pa.array(plan.rewards, pa.float64()),
            "advantage": pa.array(plan.advantages, pa.float32()),
            "n_samples": pa.array([samples_per_rollout[r] for r in plan.rollout_ids], pa.int32()),
            "call_event_ids": _call_event_ids(rows.calls, plan.rollout_ids),
            "reward_event_ids": pa.array(plan.reward_event_ids, pa.list_(pa.string())),
        }
    )


def _call_event_ids(calls: pa.Table, rollout_ids: list[str]) -> pa.ListArray:
    """Per rollout (in ``rollout_ids`` order): its ok calls' request event ids by seq, then their response event ids.

    ``calls``: the ok calls sorted by rollout_id, seq, req_event_id (``CallRows.calls``). Laid out with array
    operations (a SQL ``list()`` per rollout converted to Python lists took ~0.3 s CPU at 1,600 rollouts / 34k calls).
    """
    n = calls.num_rows
    run_ends = pc.run_end_encode(calls["rollout_id"].combine_chunks())
    ends = run_ends.run_ends.to_numpy().astype(np.int64)
    starts = np.concatenate(([0], ends[:-1]))
    counts = ends - starts
    # Output position p of rollout r (starting at 2 * starts[r]) takes request j = starts[r] + local while local
    # < counts[r], then response j - counts[r] (responses follow the requests in the combined array, offset n).
    local = np.arange(2 * n, dtype=np.int64) - np.repeat(2 * starts, 2 * counts)
    first = np.repeat(starts, 2 * counts)
    within = np.repeat(counts, 2 * counts)
    source = np.where(local < within, first + local, n + first + local - within)
    values = pa.concat_arrays([calls[name].combine_chunks() for name in ("req_event_id", "resp_event_id")])
    lists = pa.ListArray.from_arrays(pa.array(np.concatenate(([0], 2 * ends)).astype(np.int32)), values.take(source))
    found = pc.index_in(pa.array(rollout_ids, pa.string()), value_set=run_ends.values)
    return lists.take(found)


def _manifest(
    name: str, version: int, config: BuildConfig, snapshot: Snapshot, counts: dict[str, Any], stream: SampleStream,
    content_hash: str,
) -> dict[str, Any]:
    return {
        "dataset": name,
        "version": version,
        "built_at": datetime.now(timezone.utc).isoformat(),
        "code_version": code_version(),
        "content_hash": content_hash,
        "sources": dict(snapshot.versions),
        "filters": json.loads(config.selection.model_dump_json()),
        "reward_rule": config.reward_rule.describe(),
        "tool_credit": config.tool_credit.describe() if config.tool_credit else None,
        "advantage": config.advantage,
        "mask": config.mask,
        "config": json.loads(config.model_dump_json()),
        "counts": {**counts, "samples": stream.n_samples, "tokens": stream.n_tokens,
                   "trained_tokens": stream.n_trained_tokens,
                   "samples_without_observations": stream.n_without_observations},
        "merge": stream.merge_statistics(),
        "schema": SAMPLES.names,
    }
