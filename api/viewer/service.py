"""What the viewer pages read, without HTTP: the rollout list, its filter values, one rollout in full.

Every read goes through the ``QueryService``'s tenant sandbox (the tenant's
rows only) or its trajectory lookup, so a page shows the key's tenant and
nothing else; a rollout of another tenant is "not found".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from api.services import QueryService
from api.viewer.models import CallText, Facets, RolloutDetail, RolloutRow, RolloutRows, ToolText
from api.viewer.tokens import TokenDecoder, token_view
from schemas.tables import LLM_CALLS_VIEW, ROLLOUTS_VIEW, TOOL_STEPS_VIEW
from store.messages import full_messages_json, request_rows_sql

MAX_TEXT_CHARS = 20_000
"""Longest text (messages JSON, response, tool arguments or result) the rollout page shows per field."""

_LIST_COLUMNS = ("rollout_id, task_id, harness_name, harness_version, status, reward, n_llm_calls, n_tool_calls, "
                 "n_response_tokens, llm_latency_ms, coalesce(started_at, first_event_at) AS started_at")
_CALL_TEXT = (f"SELECT call_id, messages, prompt, text, tool_calls FROM {LLM_CALLS_VIEW} WHERE rollout_id = ? "
              "ORDER BY seq, requested_at, call_id")
_CALL_MESSAGES = request_rows_sql("rollout_id = ?")
_TOOL_TEXT = (f"SELECT call_id, arguments, result FROM {TOOL_STEPS_VIEW} WHERE rollout_id = ? "
              "ORDER BY seq, called_at, call_id")
_FACETS = ("SELECT list(DISTINCT harness_name || '@' || coalesce(harness_version, '?') ORDER BY 1) "
           "FILTER (WHERE harness_name IS NOT NULL) AS harnesses, "
           f"list(DISTINCT status ORDER BY status) AS statuses, count(*) AS n_rollouts FROM {ROLLOUTS_VIEW}")


@dataclass(frozen=True)
class RolloutFilter:
    """The list page's filters; None means any."""

    task_id: str | None = None
    harness: str | None = None
    """``NAME`` or ``NAME@VERSION``."""
    status: str | None = None
    min_reward: float | None = None
    max_reward: float | None = None

    def where(self) -> tuple[str, list[Any]]:
        """SQL condition over the ``rollouts`` view and its parameters."""
        where, params = ["true"], []
        name, _, version = (self.harness or "").partition("@")
        for column, value in (("task_id", self.task_id), ("harness_name", name or None),
                              ("harness_version", version or None), ("status", self.status)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        if self.min_reward is not None:
            where.append("reward >= ?")
            params.append(self.min_reward)
        if self.max_reward is not None:
            where.append("reward <= ?")
            params.append(self.max_reward)
        return " AND ".join(where), params


def list_rollouts(service: QueryService, tenant: str, wanted: RolloutFilter, *, limit: int | None,
                  offset: int) -> RolloutRows:
    """A page of the tenant's rollouts matching ``wanted``, newest first."""
    limit = service.pages.clamp(limit)
    where, params = wanted.where()
    sql = (f"SELECT {_LIST_COLUMNS} FROM {ROLLOUTS_VIEW} WHERE {where} "
           "ORDER BY first_event_at DESC, rollout_id LIMIT ? OFFSET ?")
    with service.sandbox(tenant) as box:
        rows = box.execute(sql, [*params, limit + 1, offset]).to_pylist()
    more = len(rows) > limit
    return RolloutRows(items=[RolloutRow(**r) for r in rows[:limit]], limit=limit, offset=offset,
                       next_offset=offset + limit if more else None)


def facets(service: QueryService, tenant: str) -> Facets:
    """The harness versions and statuses the tenant's rollouts have (for the filter menus)."""
    with service.sandbox(tenant) as box:
        row = box.execute(_FACETS).to_pylist()[0]
    return Facets(harnesses=row["harnesses"] or [], statuses=row["statuses"] or [], n_rollouts=row["n_rollouts"])


def rollout_detail(service: QueryService, tenant: str, rollout_id: str, decoder: TokenDecoder) -> RolloutDetail:
    """One rollout's steps, the full text of its calls and tool steps, and its token view (``NotFound``)."""
    trajectory = service.trajectory(tenant, rollout_id)
    with service.sandbox(tenant) as box:
        full = full_messages_json(box.execute(_CALL_MESSAGES, [rollout_id]).to_pylist())  # references resolved
        calls = [CallText(**_cut({**r, "messages": full.get(r["call_id"], r["messages"])},
                                 ("messages", "prompt", "text", "tool_calls")))
                 for r in box.execute(_CALL_TEXT, [rollout_id]).to_pylist()]
        tools = [ToolText(**_cut(r, ("arguments", "result")))
                 for r in box.execute(_TOOL_TEXT, [rollout_id]).to_pylist()]
        tokens = token_view(service.lake, box, rollout_id, decoder)
    return RolloutDetail(trajectory=trajectory, calls=calls, tools=tools, tokens=tokens)


def _cut(row: dict[str, Any], fields: tuple[str, ...]) -> dict[str, Any]:
    """The row with each text field cut at ``MAX_TEXT_CHARS`` and ``truncated`` set when any was."""
    long = [f for f in fields if row[f] is not None and len(row[f]) > MAX_TEXT_CHARS]
    return {**row, **{f: row[f][:MAX_TEXT_CHARS] for f in long}, "truncated": bool(long)}
