"""Full prompt ids from prefix references, for the calls of one rollout.

An ``llm.request`` with a prefix reference stores only the ids after the
prefix it shares with an earlier call of the rollout (``schemas/EVENTS.md``):
its full prompt is ``(full prompt of extends_call_id + that call's response
ids)[:extends_tokens] + its own ids``. ``full_prompts`` follows those chains
for one rollout's calls; the SQL view ``llm_call_prompts`` does the same over
the whole lake. A call whose chain cannot be followed gets a reason instead
of ids (``UNRESOLVED_REASONS``); readers skip it and count the reason, as the
dataset build does, rather than guess a prompt.

>>> prompts, problems = full_prompts([
...     StoredCall("c1", [1, 2], [3]), StoredCall("c2", [4], [5], extends_call_id="c1", extends_tokens=3)])
>>> prompts["c2"].tolist(), problems
([1, 2, 3, 4], {})
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from store.reference_chains import follow_references

UNRESOLVED_REASONS = ("missing_call", "beyond_prefix", "no_ids", "cycle")
"""Why a call's full prompt cannot be rebuilt: the referenced call is not in the rollout (not ingested yet, or
forgotten); ``extends_tokens`` is longer than that call's prompt + response; a call of the chain has no prompt
ids; the chain loops."""

Ids = Sequence[int] | np.ndarray


@dataclass(frozen=True)
class StoredCall:
    """One call's ids as stored: its prompt ids (only the new ones under a reference) and response ids."""

    call_id: str
    prompt: Ids | None
    response: Ids | None
    extends_call_id: str | None = None
    extends_tokens: int | None = None


def full_prompts(calls: Iterable[StoredCall]) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """(call_id -> full prompt ids as int32 arrays, call_id -> reason for the calls that do not resolve).

    ``calls`` are one rollout's (and one tenant's) calls, one per call_id.
    """
    by_id = {c.call_id: c for c in calls}
    prompts: dict[str, np.ndarray] = {}
    problems = follow_references(by_id, lambda c: c.extends_call_id if c.extends_tokens is not None else None,
                                 lambda c: _extend(c, by_id, prompts), prompts)
    return prompts, problems


def _extend(call: StoredCall, by_id: dict[str, StoredCall], prompts: dict[str, np.ndarray]) -> str | None:
    """Put ``call``'s full prompt in ``prompts`` (its reference resolved before); else the reason."""
    if call.prompt is None:
        return "no_ids"
    own = np.asarray(call.prompt, dtype=np.int32)
    if call.extends_call_id is None or call.extends_tokens is None:
        prompts[call.call_id] = own
        return None
    before = by_id[call.extends_call_id]
    response = np.asarray(before.response if before.response is not None else (), dtype=np.int32)
    shared = prompts[call.extends_call_id]
    if call.extends_tokens > len(shared) + len(response):
        return "beyond_prefix"
    head = np.concatenate([shared, response])[: call.extends_tokens]
    prompts[call.call_id] = np.concatenate([head, own])
    return None


def stored_calls(rows: Iterable[dict]) -> list[StoredCall]:
    """``StoredCall``s from rows with ``call_id``, ``prompt_token_ids``, ``response_token_ids``,
    ``extends_call_id``, ``extends_tokens`` (e.g. ``llm_calls`` rows of one rollout)."""
    return [StoredCall(r["call_id"], r["prompt_token_ids"], r["response_token_ids"], r.get("extends_call_id"),
                       r.get("extends_tokens")) for r in rows]
