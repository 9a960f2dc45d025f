"""State-change-conditioned tool credit: reward a tool run only when the world changed before it.

The rule (``BuildConfig(tool_credit=ToolCredit(tool="run_tests", value=0.1))``,
CLI ``--tool-credit run_tests=0.1`` or ``run_tests=0.1,max=3``): walk a
rollout's ``tool.result`` rows in ``seq`` order. A run of the credited tool
earns ``value`` only if some *other* tool result with ``state_changed = true``
came after the previous run of that tool, or, for the first run, since the
rollout started. At most ``max`` runs per rollout are credited. Then:

- the tool's own results never count as a change, neither for that run nor
  for the next one: running the tests writes caches and logs, and a run that
  "changed the world" by running must not open the door to the next run;
- ``state_changed`` null (the harness could not tell) is no evidence of a
  change; ``false`` is none either;
- a tool result repeated under the same ``call_id`` (a harness retry of the
  report) counts once, its first row by seq;
- the credit is added to the rollout's reward from the reward rule (a
  rollout still needs that reward to enter a dataset), and the event ids of
  the credited runs join its ``reward_event_ids``, so lineage traces the
  credit to the tool results that earned it.

The reward-hacking loop it prevents. A harness that rewards every passing
test run (say +0.1 per run) teaches the agent that calling ``run_tests`` is
worth reward in itself: a policy learns to run the suite 30 times in a row,
each run "passing", and farms 3.0 for doing nothing, which can outweigh the
outcome reward of actually fixing the bug. Under ``--tool-credit
run_tests=0.1`` only a run that follows a change counts: edit, test, edit,
test earns 0.2, and the 30 back-to-back runs earn 0.1 at most (the first,
if an edit came before it): runs 2..30 earn 0 because nothing changed
between them. ``max`` bounds what even genuine edit/test cycles can earn
(e.g. a one-line no-op edit before each run).
"""

from __future__ import annotations

import duckdb
import numpy as np
import pyarrow as pa

from pipelines.datasets.config import ToolCredit
from schemas.tables import TOOL_RESULTS_TABLE

NO_CAP = 2**62

TOOL_RUNS = f"""
WITH results AS (
    SELECT rollout_id, event_id, seq, name, state_changed,
           row_number() OVER (PARTITION BY rollout_id, call_id ORDER BY seq, event_id) AS k
    FROM {TOOL_RESULTS_TABLE} SEMI JOIN selected USING (tenant, rollout_id)),
walked AS (
    SELECT *, sum(CASE WHEN name <> $tool AND state_changed THEN 1 ELSE 0 END)
                  OVER (PARTITION BY rollout_id ORDER BY seq, event_id ROWS UNBOUNDED PRECEDING) AS changes
    FROM results WHERE k = 1),
runs AS (
    SELECT rollout_id, event_id, seq,
           changes > coalesce(lag(changes) OVER (PARTITION BY rollout_id ORDER BY seq, event_id), 0) AS earns
    FROM walked WHERE name = $tool),
ranked AS (
    SELECT *, sum(earns::INTEGER) OVER (PARTITION BY rollout_id ORDER BY seq, event_id
                                        ROWS UNBOUNDED PRECEDING) AS nth_earning
    FROM runs)
SELECT rollout_id, count(*) AS runs,
       count(*) FILTER (WHERE earns AND nth_earning <= $cap) AS credited_runs,
       coalesce(list(event_id ORDER BY seq, event_id) FILTER (WHERE earns AND nth_earning <= $cap),
                []::VARCHAR[]) AS credited_event_ids
FROM ranked GROUP BY rollout_id
"""
"""Per selected rollout with runs of the tool: runs, credited runs, the credited runs' event ids."""


def tool_runs(con: duckdb.DuckDBPyConnection, credit: ToolCredit) -> pa.Table:
    """The credited tool's runs of every rollout in temp table ``selected`` (needs a ``tool_results`` view)."""
    cap = credit.max_runs if credit.max_runs is not None else NO_CAP
    return con.execute(TOOL_RUNS, {"tool": credit.tool, "cap": cap}).to_arrow_table()


def add_tool_credit(
    con: duckdb.DuckDBPyConnection, rollouts: pa.Table, credit: ToolCredit
) -> tuple[pa.Table, dict[str, int]]:
    """``rollouts`` (rollout_id, reward, reward_event_ids, ...) with the credit added; counts for the manifest.

    >>> rollouts, counts = add_tool_credit(con, rollouts, ToolCredit.parse("run_tests=0.1"))  # doctest: +SKIP
    >>> counts  # doctest: +SKIP
    {'runs': 31, 'credited_runs': 2, 'rollouts_credited': 1}
    """
    runs = tool_runs(con, credit)
    by_rollout = {r: (n, ids) for r, n, ids in zip(runs["rollout_id"].to_pylist(), runs["credited_runs"].to_pylist(),
                                                   runs["credited_event_ids"].to_pylist())}
    in_plan = [by_rollout.get(r, (0, [])) for r in rollouts["rollout_id"].to_pylist()]
    credited = np.array([n for n, _ in in_plan], dtype=np.float64)
    reward = rollouts["reward"].to_numpy() + credit.value * credited
    event_ids = [old + ids for old, (_, ids) in zip(rollouts["reward_event_ids"].to_pylist(), in_plan)]
    rollouts = rollouts.set_column(rollouts.schema.get_field_index("reward"), "reward", pa.array(reward, pa.float64()))
    rollouts = rollouts.set_column(rollouts.schema.get_field_index("reward_event_ids"), "reward_event_ids",
                                   pa.array(event_ids, pa.list_(pa.string())))
    planned = set(rollouts["rollout_id"].to_pylist())
    counts = {
        "runs": sum(n for r, n in zip(runs["rollout_id"].to_pylist(), runs["runs"].to_pylist()) if r in planned),
        "credited_runs": int(credited.sum()),
        "rollouts_credited": int((credited > 0).sum()),
    }
    return rollouts, counts
