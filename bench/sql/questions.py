"""The canonical questions, each through the views and written by hand against the raw tables.

Both forms must give the same answer (``run.py`` checks it). The hand-written
form is what someone who knows the tables would write: it deduplicates the
same way the views do (first request by seq, a success before an error, a
rollout's last end, the latest value of each reward name), but reads only the
columns its question needs.
"""

from __future__ import annotations

from dataclasses import dataclass

_REQUEST = ("SELECT DISTINCT ON (tenant, rollout_id, call_id) tenant, rollout_id, call_id, {cols} FROM llm_requests "
            "{where} ORDER BY tenant, rollout_id, call_id, seq, ts, event_id")
_RESPONSE = ("SELECT DISTINCT ON (tenant, rollout_id, call_id) tenant, rollout_id, call_id, {cols} FROM llm_responses "
             "{where} ORDER BY tenant, rollout_id, call_id, error IS NOT NULL, seq, ts, event_id")


@dataclass(frozen=True)
class Question:
    name: str
    kind: str
    """``scalar`` (counts and group-bys: goal < 0.1 s) or ``tokens`` (token-list aggregates: goal < 1 s)."""
    view: str
    raw: str


def questions(rollout_id: str) -> list[Question]:
    """The questions; ``rollout_id`` is the rollout whose calls are listed in order."""
    one = f"WHERE rollout_id = '{rollout_id}'"
    return [
        Question("count_calls", "scalar", "SELECT count(*) AS n FROM llm_calls",
                 "SELECT count(*) AS n FROM (SELECT DISTINCT tenant, rollout_id, call_id FROM llm_requests)"),
        Question("calls_by_model_finish", "scalar",
                 "SELECT model, finish_reason, count(*) AS n, round(avg(latency_ms), 3) AS latency_ms "
                 "FROM llm_calls GROUP BY ALL",
                 f"WITH q AS ({_REQUEST.format(cols='model', where='')}), "
                 f"r AS ({_RESPONSE.format(cols='finish_reason, latency_ms', where='')}) "
                 "SELECT model, finish_reason, count(*) AS n, round(avg(latency_ms), 3) AS latency_ms "
                 "FROM q LEFT JOIN r USING (tenant, rollout_id, call_id) GROUP BY ALL"),
        Question("success_by_harness_day", "scalar",
                 "SELECT harness_version, date_trunc('day', started_at) AS day, count(*) AS n, "
                 "round(avg((status = 'succeeded')::INT), 6) AS success_rate FROM rollouts GROUP BY ALL",
                 "WITH s AS (SELECT DISTINCT ON (tenant, rollout_id) tenant, rollout_id, harness_version, ts "
                 "FROM rollout_starts ORDER BY tenant, rollout_id, seq, ts, event_id), "
                 "e AS (SELECT DISTINCT ON (tenant, rollout_id) tenant, rollout_id, status FROM rollout_ends "
                 "ORDER BY tenant, rollout_id, seq DESC, ts DESC, event_id DESC) "
                 "SELECT harness_version, date_trunc('day', ts) AS day, count(*) AS n, "
                 "round(avg((coalesce(status, 'running') = 'succeeded')::INT), 6) AS success_rate "
                 "FROM s LEFT JOIN e USING (tenant, rollout_id) GROUP BY ALL"),
        Question("tool_error_rates", "scalar",
                 "SELECT name, count(*) AS n, round(avg((error IS NOT NULL)::INT), 6) AS error_rate "
                 "FROM tool_steps GROUP BY ALL",
                 "WITH c AS (SELECT DISTINCT ON (tenant, rollout_id, call_id) tenant, rollout_id, call_id, name "
                 "FROM tool_calls ORDER BY tenant, rollout_id, call_id, seq, ts, event_id), "
                 "r AS (SELECT DISTINCT ON (tenant, rollout_id, call_id) tenant, rollout_id, call_id, error "
                 "FROM tool_results ORDER BY tenant, rollout_id, call_id, seq, ts, event_id) "
                 "SELECT name, count(*) AS n, round(avg((error IS NOT NULL)::INT), 6) AS error_rate "
                 "FROM c LEFT JOIN r USING (tenant, rollout_id, call_id) GROUP BY ALL"),
        Question("reward_distribution", "scalar",
                 "SELECT round(reward, 1) AS bucket, count(*) AS n FROM rollouts WHERE reward IS NOT NULL GROUP BY ALL",
                 "WITH latest AS (SELECT DISTINCT ON (tenant, rollout_id, name) tenant, rollout_id, value "
                 "FROM rewards ORDER BY tenant, rollout_id, name, ts DESC, seq DESC, event_id DESC) "
                 "SELECT round(reward, 1) AS bucket, count(*) AS n "
                 "FROM (SELECT sum(value) AS reward FROM latest GROUP BY tenant, rollout_id) GROUP BY ALL"),
        Question("one_rollout_in_order", "scalar",
                 "SELECT seq, call_id, n_prompt_tokens, n_response_tokens, finish_reason FROM llm_calls "
                 f"{one} ORDER BY seq, call_id",
                 f"WITH q AS ({_REQUEST.format(cols='seq, n_prompt_tokens', where=one)}), "
                 f"r AS ({_RESPONSE.format(cols='n_response_tokens, finish_reason', where=one)}) "
                 "SELECT seq, call_id, n_prompt_tokens, n_response_tokens, finish_reason "
                 "FROM q LEFT JOIN r USING (tenant, rollout_id, call_id) ORDER BY seq, call_id"),
        Question("prompt_tokens_counted", "scalar",  # the token total users ask for: from the per-call count column
                 "SELECT sum(n_prompt_tokens) AS tokens FROM llm_calls",
                 "SELECT sum(n) AS tokens FROM (SELECT arg_min_null(n_prompt_tokens, (seq, ts, event_id)) AS n "
                 "FROM llm_requests GROUP BY tenant, rollout_id, call_id)"),
        Question("prompt_token_total", "tokens",
                 "SELECT sum(len(prompt_token_ids)) AS ids FROM llm_calls",
                 "SELECT sum(ids) AS ids FROM (SELECT arg_min_null(len(prompt_token_ids), (seq, ts, event_id)) AS ids "
                 "FROM llm_requests GROUP BY tenant, rollout_id, call_id)"),
        Question("response_tokens_by_source", "tokens",
                 "SELECT token_source, sum(len(response_token_ids)) AS ids, max(list_max(response_token_ids)) AS top "
                 "FROM llm_calls GROUP BY ALL",
                 "WITH r AS (SELECT tenant, rollout_id, call_id, "
                 "arg_min_null(token_source, (error IS NOT NULL, seq, ts, event_id)) AS token_source, "
                 "arg_min_null(len(response_token_ids), (error IS NOT NULL, seq, ts, event_id)) AS ids, "
                 "arg_min_null(list_max(response_token_ids), (error IS NOT NULL, seq, ts, event_id)) AS top "
                 "FROM llm_responses GROUP BY ALL), "
                 "q AS (SELECT DISTINCT tenant, rollout_id, call_id FROM llm_requests) "
                 "SELECT token_source, sum(ids) AS ids, max(top) AS top "
                 "FROM q LEFT JOIN r USING (tenant, rollout_id, call_id) GROUP BY ALL"),
    ]
