"""Full messages and tools from messages references, for the calls of one rollout.

An ``llm.request`` with a messages reference stores only the messages after
the first ``extends_messages`` of the referenced call's full messages, and no
tools when ``extends_tools`` (``schemas/EVENTS.md``); ``extends_messages`` one
past those messages counts the referenced call's answer too (the harness's
echo, rebuilt from its ``llm.response`` by ``schemas.answer_message``). ``full_messages``
follows those chains for one rollout's calls; the SQL view
``llm_call_messages`` does the same over the whole lake. A call whose chain
cannot be followed gets a reason instead (``UNRESOLVED_REASONS``).

>>> calls = [StoredMessages("c1", '[{"role": "user", "content": "hi"}]', '[{"type": "function"}]'),
...          StoredMessages("c2", '[{"role": "assistant", "content": "yo"}]', None, "c1", 1, True)]
>>> full, problems = full_messages(calls)
>>> [m["content"] for m in full["c2"].messages], full["c2"].tools, problems
(['hi', 'yo'], [{'type': 'function'}], {})
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from schemas.answer_message import answer_message
from schemas.table_names import LLM_CALLS_VIEW, LLM_REQUESTS_TABLE
from store.reference_chains import follow_references

UNRESOLVED_REASONS = ("missing_call", "beyond_prefix", "missing_answer", "cycle")
"""Why a call's full messages cannot be rebuilt: the referenced call is not in the rollout (not ingested yet, or
forgotten); ``extends_messages`` is longer than that call's full messages and its answer; it counts that call's
answer, which has no successful response (not ingested yet) or no message layout; the chain loops."""


@dataclass(frozen=True)
class StoredMessages:
    """One call's messages and tools as stored (JSON text, as in ``llm_requests``) and its reference."""

    call_id: str
    messages: str | None
    tools: str | None
    extends_call_id: str | None = None
    extends_messages: int | None = None
    extends_tools: bool | None = None
    answer: dict[str, Any] | None = None
    """The message the call's answer rebuilds to (``schemas.answer_message``); None: no successful response at
    hand."""

    @property
    def references(self) -> bool:
        return self.extends_call_id is not None and (self.extends_messages is not None or bool(self.extends_tools))


@dataclass(frozen=True)
class FullMessages:
    """A call's full messages and tools, as the client sent them (None where it sent none)."""

    messages: list[dict[str, Any]] | None
    tools: list[dict[str, Any]] | None


def full_messages(calls: Iterable[StoredMessages]) -> tuple[dict[str, FullMessages], dict[str, str]]:
    """(call_id -> full messages and tools, call_id -> reason for the calls that do not resolve).

    ``calls`` are one rollout's (and one tenant's) calls, one per call_id.
    """
    by_id = {c.call_id: c for c in calls}
    done: dict[str, FullMessages] = {}
    problems = follow_references(by_id, lambda c: c.extends_call_id if c.references else None,
                                 lambda c: _extend(c, by_id[c.extends_call_id] if c.references else None, done), done)
    return done, problems


def _extend(call: StoredMessages, referenced: StoredMessages | None, done: dict[str, FullMessages]) -> str | None:
    """Put ``call``'s full messages in ``done`` (its reference, ``referenced``, resolved before); else the reason."""
    own = FullMessages(_loads(call.messages), _loads(call.tools))
    if referenced is None:
        done[call.call_id] = own
        return None
    before = done[referenced.call_id]
    messages = own.messages
    if call.extends_messages is not None:
        shared = before.messages
        if shared is None or call.extends_messages > len(shared) + 1:
            return "beyond_prefix"
        if call.extends_messages == len(shared) + 1:
            if referenced.answer is None:
                return "missing_answer"
            shared = [*shared, referenced.answer]
        messages = shared[: call.extends_messages] + (own.messages or [])
    done[call.call_id] = FullMessages(messages, before.tools if call.extends_tools else own.tools)
    return None


def _loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def request_rows_sql(where: str) -> str:
    """The query of the rows ``stored_messages`` and ``full_messages_json`` read: ``llm_requests`` with each
    call's answer (``text``, ``tool_calls``, ``answered``: a successful response is stored), in ``seq`` order;
    ``where`` filters on unqualified ``tenant`` / ``rollout_id`` (e.g. ``"rollout_id = ?"``)."""
    return (f"SELECT rollout_id, q.call_id, q.messages, q.tools, q.extends_call_id, q.extends_messages, q.extends_tools, "
            f"c.text, c.tool_calls, coalesce(c.has_response AND c.error IS NULL, false) AS answered "
            f"FROM {LLM_REQUESTS_TABLE} AS q LEFT JOIN {LLM_CALLS_VIEW} AS c USING (tenant, rollout_id, call_id) "
            f"WHERE {where} ORDER BY q.seq, q.event_id")


def full_messages_json(rows: Iterable[dict]) -> dict[str, str]:
    """call_id -> the call's full messages as JSON text, for the calls of one rollout whose messages a reference
    shortened (resolved; the others are stored whole). ``rows``: its rows as ``request_rows_sql`` reads them, in
    ``seq`` order; a call_id recorded twice (a retry) counts once, as its first row."""
    first: dict[str, dict] = {}
    for row in rows:
        first.setdefault(row["call_id"], row)
    if all(r["extends_messages"] is None for r in first.values()):
        return {}
    full, _ = full_messages(stored_messages(first.values()))
    return {call_id: json.dumps(f.messages, ensure_ascii=False) for call_id, f in full.items()
            if first[call_id]["extends_messages"] is not None}


def stored_messages(rows: Iterable[dict]) -> list[StoredMessages]:
    """``StoredMessages`` from ``llm_requests`` rows (``call_id``, ``messages``, ``tools``, ``extends_call_id``,
    ``extends_messages``, ``extends_tools``) and, where given, their answer (``text``, ``tool_calls`` as JSON
    text, ``answered``; ``request_rows_sql``)."""
    return [StoredMessages(r["call_id"], r["messages"], r["tools"], r.get("extends_call_id"),
                           r.get("extends_messages"), r.get("extends_tools"), _answer(r)) for r in rows]


def _answer(row: dict) -> dict[str, Any] | None:
    if not row.get("answered"):
        return None
    return answer_message(row.get("text"), _loads(row.get("tool_calls")))
