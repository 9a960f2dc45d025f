"""``follow_references``: the chain walk shared by prompt ids and messages references."""

from __future__ import annotations

from store.reference_chains import follow_references


def rebuild_all(parents: dict[str, str | None], refuse: frozenset[str] = frozenset()) -> tuple[list[str], dict[str, str]]:
    """Calls named by their parent; the order they were rebuilt in, and the reasons."""
    order: list[str] = []

    def rebuild(call_id: str) -> str | None:
        if call_id in refuse:
            return "refused"
        assert parents[call_id] is None or parents[call_id] in order, "rebuilt before its parent"
        order.append(call_id)
        return None

    problems = follow_references({c: c for c in parents}, parents.get, rebuild, order)
    return order, problems


def test_each_call_is_rebuilt_once_after_the_call_it_extends():
    order, problems = rebuild_all({"c3": "c2", "c1": None, "c2": "c1", "d1": None})
    assert sorted(order) == ["c1", "c2", "c3", "d1"] and len(order) == 4 and problems == {}


def test_a_broken_chain_gives_its_reason_to_every_call_after_the_break():
    order, problems = rebuild_all({"a2": "gone", "a3": "a2", "b1": "b2", "b2": "b1", "c1": None, "c2": "c1",
                                   "c3": "c2"}, refuse=frozenset({"c2"}))
    assert order == ["c1"]
    assert problems == {"a2": "missing_call", "a3": "missing_call", "b1": "cycle", "b2": "cycle",
                        "c2": "refused", "c3": "refused"}
