"""Follow the references between one rollout's calls: each call is rebuilt after the call it extends.

Prompt ids (``store.prompts``) and messages (``store.messages``) reference an
earlier call of the same rollout the same way; what differs is how a call is
rebuilt from the one it extends. This walks each call's chain back to a call
already rebuilt (or one stored whole), then rebuilds forward, and gives a
reason instead for every call of a chain that breaks.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Mapping
from typing import TypeVar

Call = TypeVar("Call")


def follow_references(by_id: Mapping[str, Call], parent: Callable[[Call], str | None],
                      rebuild: Callable[[Call], str | None], rebuilt: Container[str]) -> dict[str, str]:
    """Rebuild every call of ``by_id`` (call_id -> call) in reference order; call_id -> reason for those that cannot be.

    ``parent(call)`` is the call_id it extends (None: stored whole); ``rebuild(call)``, called once its parent is
    rebuilt, adds it to ``rebuilt`` or returns why it cannot. Reasons: ``missing_call`` (the referenced call is not in
    the rollout), ``cycle``, or ``rebuild``'s; a call after a broken one in its chain gets that one's reason.
    """
    problems: dict[str, str] = {}
    for call_id in by_id:
        chain: list[tuple[str, Call]] = []  # walked back from call_id to a rebuilt call or a root
        at: str | None = call_id
        reason = None
        while at is not None and at not in rebuilt and at not in problems:
            call = by_id.get(at)
            if call is None or any(at == seen for seen, _ in chain):
                reason = "missing_call" if call is None else "cycle"
                break
            chain.append((at, call))
            at = parent(call)
        reason = reason or (problems.get(at) if at is not None else None)
        for at, call in reversed(chain):
            reason = reason or rebuild(call)
            if reason is not None:
                problems[at] = reason
    return problems
