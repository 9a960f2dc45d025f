"""Text excerpts for people: what ``store.trajectory`` puts in its steps and ``trajlake sql`` in a table's cells.

Apart from ``store.trajectory`` (pydantic models), so that printing a query's answer loads no pydantic."""

from __future__ import annotations

EXCERPT_CHARS = 200
"""Default length of text excerpts (prompt, response, tool arguments and results)."""


def excerpt(text: str | None, chars: int = EXCERPT_CHARS) -> str | None:
    """``text`` cut to ``chars`` characters with an ellipsis, whitespace runs folded; None for 0.

    >>> excerpt("a  long\\ntext", 6)
    'a lon…'
    """
    if text is None or chars <= 0:
        return None
    folded = " ".join(text.split())
    return folded if len(folded) <= chars else folded[: chars - 1] + "…"
