"""One rollout read back in order: start, LLM calls, tool steps, rewards, finish.

Plain data (pydantic models, no printing) so the CLI, the query API and a
trajectory viewer can all render it. Steps are ordered by the producer's
``seq`` (then ts): the order the harness saw. Token arrays are not loaded;
each LLM call carries its token counts, as the views do.

>>> t = load_trajectory(Lake("./lake"), "r-42")  # doctest: +SKIP
>>> [s.kind for s in t.steps]  # doctest: +SKIP
['rollout.started', 'llm.call', 'tool.call', 'rollout.finished', 'reward']
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field

from schemas.errors import NotFound, TrajlakeError
from schemas.table_names import (
    LLM_CALLS_VIEW,
    REWARDS_TABLE,
    ROLLOUT_ENDS_TABLE,
    ROLLOUT_STARTS_TABLE,
    ROLLOUTS_VIEW,
    TOOL_STEPS_VIEW,
)
from store.text import EXCERPT_CHARS, excerpt

if TYPE_CHECKING:  # the step models import without DuckDB or deltalake (the CLI's --help stays light)
    import duckdb

    from store.lake import Lake


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class _Step(_Model):
    seq: int
    ts: datetime


class RolloutStartStep(_Step):
    """The harness began the rollout."""

    kind: Literal["rollout.started"] = "rollout.started"
    group_id: str
    policy_version: str | None
    metadata: str | None
    """JSON text as the producer sent it."""


class LlmCallStep(_Step):
    """One LLM call (request + response, if it arrived); ``ts`` is the request's."""

    kind: Literal["llm.call"] = "llm.call"
    call_id: str
    model: str | None
    n_prompt_tokens: int | None
    n_response_tokens: int | None
    token_source: str | None
    finish_reason: str | None
    latency_ms: float | None
    upstream_retries: int | None
    policy_version: str | None
    error: str | None
    has_response: bool
    responded_at: datetime | None
    prompt_excerpt: str | None
    """Start of the last message (chat) or of the prompt text (completions)."""
    text_excerpt: str | None
    """Start of the response text."""


class ToolStep(_Step):
    """One tool call (call + result, if it arrived); ``ts`` is the call's."""

    kind: Literal["tool.call"] = "tool.call"
    call_id: str
    name: str
    arguments_excerpt: str | None
    result_excerpt: str | None
    error: str | None
    duration_ms: float | None
    state_changed: bool | None
    has_result: bool


class RewardStep(_Step):
    """A reward event (every one, re-scores included)."""

    kind: Literal["reward"] = "reward"
    name: str
    value: float
    source: str | None


class RolloutEndStep(_Step):
    """The harness ended the rollout."""

    kind: Literal["rollout.finished"] = "rollout.finished"
    status: str
    reason: str | None
    steps: int | None


Step = Annotated[
    Union[RolloutStartStep, LlmCallStep, ToolStep, RewardStep, RolloutEndStep], Field(discriminator="kind")
]


class RolloutSummary(_Model):
    """The rollout's row of the ``rollouts`` view (see store/views.sql)."""

    tenant: str
    task_id: str
    rollout_id: str
    group_id: str
    attempt: int
    harness_name: str | None
    harness_version: str | None
    harness_config_hash: str | None
    policy_version: str | None
    started_at: datetime | None
    finished_at: datetime | None
    status: str
    reason: str | None
    steps: int | None
    n_llm_calls: int
    n_llm_errors: int
    n_tool_calls: int
    n_tool_errors: int
    n_prompt_tokens: int
    n_response_tokens: int
    llm_latency_ms: float | None
    reward: float | None
    n_rewards: int


class Trajectory(_Model):
    """A rollout's summary and its steps in order."""

    summary: RolloutSummary
    steps: list[Step]


class RolloutNotFound(NotFound):
    """No rollout with that id (in that tenant)."""

    def __init__(self, rollout_id: str, tenant: str | None) -> None:
        where = f" for tenant {tenant!r}" if tenant else ""
        super().__init__(
            f"no rollout {rollout_id!r}{where} in the lake: list rollout ids with "
            "trajlake sql \"SELECT rollout_id, status FROM rollouts\""
        )
        self.rollout_id = rollout_id


class AmbiguousRollout(TrajlakeError, LookupError):
    """The same rollout id exists in several tenants."""

    def __init__(self, rollout_id: str, tenants: list[str]) -> None:
        super().__init__(
            f"rollout {rollout_id!r} exists in tenants {', '.join(tenants)}: pass the tenant (--tenant)"
        )
        self.tenants = tenants


def load_trajectory(
    lake: Lake,
    rollout_id: str,
    *,
    tenant: str | None = None,
    excerpt_chars: int = EXCERPT_CHARS,
    con: duckdb.DuckDBPyConnection | None = None,
) -> Trajectory:
    """Read one rollout with every step in order (``RolloutNotFound``, ``AmbiguousRollout``).

    Pass ``con`` (a ``connect(lake, sandbox=True)`` connection the caller
    keeps) when loading many rollouts: opening the views costs more than a lookup.
    """
    from store.sql import check_lake, connect

    own = con is None
    if own:
        check_lake(lake)
        con = connect(lake, sandbox=True)
    try:
        summary = _summary(con, rollout_id, tenant)
        key = [summary.tenant, summary.rollout_id]
        steps: list[Any] = [
            *(RolloutStartStep(**r) for r in _rows(con, _STARTS, key)),
            *(_llm_step(r, excerpt_chars) for r in _with_full_messages(_rows(con, _CALLS, key), con, key)),
            *(_tool_step(r, excerpt_chars) for r in _rows(con, _TOOLS, key)),
            *(RewardStep(**r) for r in _rows(con, _REWARDS, key)),
            *(RolloutEndStep(**r) for r in _rows(con, _ENDS, key)),
        ]
    finally:
        if own:
            con.close()
    steps.sort(key=lambda s: (s.seq, s.ts, _KIND_ORDER[s.kind]))
    return Trajectory(summary=summary, steps=steps)


_KIND_ORDER = {"rollout.started": 0, "llm.call": 1, "tool.call": 2, "reward": 3, "rollout.finished": 4}
_WHERE = "WHERE tenant = ? AND rollout_id = ?"
_STARTS = f"SELECT seq, ts, group_id, policy_version, metadata FROM {ROLLOUT_STARTS_TABLE} {_WHERE}"
_ENDS = f"SELECT seq, ts, status, reason, steps FROM {ROLLOUT_ENDS_TABLE} {_WHERE}"
_REWARDS = f"SELECT seq, ts, name, value, source FROM {REWARDS_TABLE} {_WHERE}"
_CALLS = f"""SELECT seq, requested_at AS ts, call_id, model, n_prompt_tokens, n_response_tokens, token_source,
    finish_reason, latency_ms, upstream_retries, policy_version, error, has_response, responded_at,
    messages, prompt, text FROM {LLM_CALLS_VIEW} {_WHERE}"""
_TOOLS = f"""SELECT seq, called_at AS ts, call_id, name, arguments, result, error, duration_ms, state_changed,
    has_result FROM {TOOL_STEPS_VIEW} {_WHERE}"""


def _rows(con: duckdb.DuckDBPyConnection, sql: str, params: list[Any]) -> list[dict[str, Any]]:
    return con.execute(sql, params).to_arrow_table().to_pylist()


def _summary(con: duckdb.DuckDBPyConnection, rollout_id: str, tenant: str | None) -> RolloutSummary:
    sql = (f"SELECT * EXCLUDE (metadata, rewards, first_event_at, last_event_at) FROM {ROLLOUTS_VIEW} "
           "WHERE rollout_id = ?")
    params = [rollout_id]
    if tenant is not None:
        sql += " AND tenant = ?"
        params.append(tenant)
    rows = _rows(con, sql + " ORDER BY tenant", params)
    if not rows:
        raise RolloutNotFound(rollout_id, tenant)
    if len(rows) > 1:
        raise AmbiguousRollout(rollout_id, [r["tenant"] for r in rows])
    return RolloutSummary(**rows[0])


def _with_full_messages(calls: list[dict[str, Any]], con: duckdb.DuckDBPyConnection, key: list[Any]
                        ) -> list[dict[str, Any]]:
    """The call rows with their FULL messages (JSON), where a messages reference stored only the new ones."""
    from store.messages import full_messages_json, request_rows_sql

    full = full_messages_json(_rows(con, request_rows_sql("tenant = ? AND rollout_id = ?"), key))
    for call in calls:
        call["messages"] = full.get(call["call_id"], call["messages"])
    return calls


def _llm_step(row: dict[str, Any], chars: int) -> LlmCallStep:
    messages, prompt, text = row.pop("messages"), row.pop("prompt"), row.pop("text")
    return LlmCallStep(
        **row, prompt_excerpt=excerpt(_last_message(messages) or prompt, chars), text_excerpt=excerpt(text, chars)
    )


def _tool_step(row: dict[str, Any], chars: int) -> ToolStep:
    arguments, result = row.pop("arguments"), _json_text(row.pop("result"))
    return ToolStep(**row, arguments_excerpt=excerpt(arguments, chars), result_excerpt=excerpt(result, chars))


def _json_text(value: str | None) -> str | None:
    """A JSON string value as its text (``"1 failed"`` -> ``1 failed``); other JSON unchanged."""
    if value is None:
        return None
    try:
        decoded = json.loads(value)
    except ValueError:
        return value
    return decoded if isinstance(decoded, str) else value


def _last_message(messages_json: str | None) -> str | None:
    """Text of the last chat message (its content, or the JSON of a structured one)."""
    if not messages_json:
        return None
    try:
        messages = json.loads(messages_json)
    except ValueError:
        return messages_json
    if not isinstance(messages, list) or not messages:
        return None
    last = messages[-1]
    content = last.get("content") if isinstance(last, dict) else last
    return content if isinstance(content, str) else json.dumps(content)
