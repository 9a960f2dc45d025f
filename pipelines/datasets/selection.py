"""Selection and reward join: which rollouts a build uses, and their reward.

Everything here is SQL over scalar columns of the pinned source tables (no
token array is decoded), so it costs one pass over small data.

``rollout_summary`` (one row per rollout) has the columns a ``--where``
predicate may use: rollout_id, task_id, tenant, group_id, attempt,
policy_version, harness_name, harness_version, harness_config_hash,
started_at, finished_at, status (NULL while unfinished), steps.
"""

from __future__ import annotations

from typing import Any

import duckdb
import pyarrow as pa

from pipelines.datasets.config import RewardRule, Selection
from schemas.errors import InputError
from schemas.tables import LLM_RESPONSES_TABLE, REWARDS_TABLE, ROLLOUT_ENDS_TABLE, ROLLOUT_STARTS_TABLE

ROLLOUT_SUMMARY = f"""
CREATE OR REPLACE TEMP VIEW rollout_summary AS
WITH s AS (
    SELECT tenant, rollout_id, arg_min(task_id, seq) AS task_id,
           arg_min(group_id, seq) AS group_id, arg_min(attempt, seq) AS attempt,
           arg_min(policy_version, seq) AS policy_version, arg_min(harness_name, seq) AS harness_name,
           arg_min(harness_version, seq) AS harness_version,
           arg_min(harness_config_hash, seq) AS harness_config_hash, min(ts) AS started_at
    FROM {ROLLOUT_STARTS_TABLE} GROUP BY tenant, rollout_id),
e AS (
    SELECT tenant, rollout_id, arg_max(status, seq) AS status, arg_max(ts, seq) AS finished_at,
           arg_max(steps, seq) AS steps, arg_min(task_id, seq) AS task_id,
           arg_min(attempt, seq) AS attempt, arg_min(harness_name, seq) AS harness_name,
           arg_min(harness_version, seq) AS harness_version,
           arg_min(harness_config_hash, seq) AS harness_config_hash
    FROM {ROLLOUT_ENDS_TABLE} GROUP BY tenant, rollout_id),
p AS (
    SELECT tenant, rollout_id, arg_min(policy_version, seq) AS policy_version
    FROM {LLM_RESPONSES_TABLE} WHERE policy_version IS NOT NULL GROUP BY tenant, rollout_id)
SELECT coalesce(s.rollout_id, e.rollout_id) AS rollout_id,
       coalesce(s.task_id, e.task_id) AS task_id,
       coalesce(s.tenant, e.tenant) AS tenant,
       coalesce(s.group_id, s.task_id, e.task_id) AS group_id,
       coalesce(s.attempt, e.attempt) AS attempt,
       coalesce(s.policy_version, p.policy_version) AS policy_version,
       coalesce(s.harness_name, e.harness_name) AS harness_name,
       coalesce(s.harness_version, e.harness_version) AS harness_version,
       coalesce(s.harness_config_hash, e.harness_config_hash) AS harness_config_hash,
       coalesce(s.started_at, e.finished_at) AS started_at,
       e.finished_at, e.status, e.steps
FROM s FULL OUTER JOIN e ON s.rollout_id = e.rollout_id AND s.tenant = e.tenant
LEFT JOIN p ON p.rollout_id = coalesce(s.rollout_id, e.rollout_id) AND p.tenant = coalesce(s.tenant, e.tenant)
"""


class BadFilter(InputError):
    """A --where predicate DuckDB cannot run."""


def selection_predicate(selection: Selection) -> tuple[str, list[Any]]:
    """SQL WHERE clause (over rollout_summary) and its parameters."""
    clauses: list[str] = []
    params: list[Any] = []
    if not selection.include_unfinished:
        clauses.append("status IS NOT NULL")
    if selection.since is not None:
        clauses.append("started_at >= ?")
        params.append(selection.since)
    if selection.until is not None:
        clauses.append("started_at < ?")
        params.append(selection.until)
    for column, values in (
        ("task_id", selection.tasks),
        ("tenant", selection.tenants),
        ("policy_version", selection.policy_versions),
        ("status", selection.statuses),
    ):
        if values:
            clauses.append(f"{column} IN ({', '.join('?' * len(values))})")
            params.extend(values)
    if selection.harnesses:
        marks = ", ".join("?" * len(selection.harnesses))
        clauses.append(f"(harness_name IN ({marks}) OR harness_name || '@' || harness_version IN ({marks}))")
        params.extend(selection.harnesses * 2)
    if selection.where:
        clauses.append(f"({selection.where})")
    return (" AND ".join(clauses) or "TRUE"), params


def reward_sql(rule: RewardRule) -> tuple[str, list[Any]]:
    """A query over ``selected`` -> rollout_id, reward, reward_event_ids, n_rewards.

    The latest reward of each name (by ts, then seq) is the one that counts;
    rollouts without a usable reward get no row (the caller counts them).
    """
    latest = f"""
        WITH latest AS (
            SELECT rollout_id, name, value, event_id,
                   row_number() OVER (PARTITION BY rollout_id, name ORDER BY ts DESC, seq DESC, event_id DESC) AS k,
                   ts, seq
            FROM {REWARDS_TABLE} SEMI JOIN selected USING (tenant, rollout_id) WHERE TRUE {{name_filter}}),
        per_name AS (SELECT * FROM latest WHERE k = 1)
    """
    params: list[Any] = []
    name_filter = ""
    if rule.kind == "latest":
        if rule.name:
            name_filter, params = "AND name = ?", [rule.name]
        body = """SELECT rollout_id, arg_max(value, (ts, seq, event_id)) AS reward,
                         [arg_max(event_id, (ts, seq, event_id))] AS reward_event_ids, count(*) AS n_rewards
                  FROM per_name GROUP BY rollout_id"""
    elif rule.kind in ("sum", "mean"):
        agg = "sum" if rule.kind == "sum" else "avg"
        body = f"""SELECT rollout_id, {agg}(value) AS reward, list(event_id ORDER BY name) AS reward_event_ids,
                          count(*) AS n_rewards FROM per_name GROUP BY rollout_id"""
    else:
        names = sorted(rule.weights)
        name_filter = f"AND name IN ({', '.join('?' * len(names))})"
        params = list(names)
        cases = " ".join("WHEN name = ? THEN CAST(? AS DOUBLE)" for _ in names)
        params += [x for n in names for x in (n, rule.weights[n])]
        body = f"""SELECT rollout_id, sum(value * CASE {cases} END) AS reward,
                          list(event_id ORDER BY name) AS reward_event_ids, count(*) AS n_rewards
                   FROM per_name GROUP BY rollout_id HAVING count(*) = {len(names)}"""
    return latest.format(name_filter=name_filter) + body, params


def create_selected(con: duckdb.DuckDBPyConnection, selection: Selection) -> int:
    """Create temp table ``selected`` (rollouts passing ``selection``); return how many ids were ambiguous.

    A rollout_id that two tenants both used in the selection is left out:
    datasets, lineage and the trainer key by rollout_id. Raises ``BadFilter``
    when the ``where`` predicate does not run.
    """
    con.execute(ROLLOUT_SUMMARY)
    where, params = selection_predicate(selection)
    try:
        con.execute(f"CREATE OR REPLACE TEMP TABLE selected AS SELECT * FROM rollout_summary WHERE {where}", params)
    except duckdb.Error as exc:
        raise BadFilter(f"the rollout filter failed: {exc}. Columns you can use: {ROLLOUT_COLUMNS}") from None
    return con.execute(
        """DELETE FROM selected WHERE rollout_id IN
           (SELECT rollout_id FROM selected GROUP BY rollout_id HAVING count(*) > 1)"""
    ).fetchone()[0]


def select_rollouts(con: duckdb.DuckDBPyConnection, selection: Selection, rule: RewardRule) -> tuple[pa.Table, dict]:
    """Rollouts that pass the selection and have a reward, plus counts of what was left out.

    A rollout is (tenant, rollout_id): rows of another tenant never join in.
    A rollout_id used by two tenants in one selection is left out of it
    (``ambiguous_id``): datasets, lineage and the trainer key by rollout_id.
    Creates the temp table ``selected`` (the selected rollouts) on ``con``.
    """
    n_ambiguous = create_selected(con, selection)
    n_selected = con.execute("SELECT count(*) FROM selected").fetchone()[0] + n_ambiguous
    query, rparams = reward_sql(rule)
    con.execute(f"CREATE OR REPLACE TEMP TABLE rewarded AS {query}", rparams)
    table = con.execute(
        """SELECT s.rollout_id, s.task_id, s.tenant, s.group_id, s.policy_version, s.status,
                  r.reward, r.reward_event_ids, r.n_rewards
           FROM selected s JOIN rewarded r USING (rollout_id) ORDER BY s.rollout_id"""
    ).to_arrow_table()
    counts = {"selected": n_selected, "ambiguous_id": n_ambiguous,
              "without_reward": n_selected - n_ambiguous - table.num_rows}
    return table, counts


ROLLOUT_COLUMNS = (
    "rollout_id, task_id, tenant, group_id, attempt, policy_version, harness_name, harness_version, "
    "harness_config_hash, started_at, finished_at, status, steps"
)
