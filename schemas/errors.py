"""Errors of the wire contract."""

from __future__ import annotations

from collections.abc import Collection

from pydantic import ValidationError


class InvalidEvent(ValueError):
    """An event that does not satisfy the contract; names the field and the problem."""

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}")

    @classmethod
    def from_validation(cls, exc: ValidationError, *, union_tags: Collection[str] = ()) -> InvalidEvent:
        """Summarise pydantic's errors: the first names the field, the rest are counted.

        A discriminated union puts the tag (the event type) first in each
        error's location; pass the tags in ``union_tags`` to drop it, so the
        field reads ``payload.value`` and not ``reward.payload.value``.
        """
        errors = exc.errors(include_url=False, include_input=False)

        def where(err: dict) -> str:
            loc = [str(p) for p in err["loc"]]
            if loc and loc[0] in union_tags:
                loc = loc[1:]
            return ".".join(loc) or "(event)"

        first = errors[0]
        problem = first["msg"]
        if len(errors) > 1:
            rest = "; ".join(f"{where(e)}: {e['msg']}" for e in errors[1:4])
            problem += f" (and {len(errors) - 1} more: {rest})"
        return cls(where(first), problem)
