"""Errors of the wire contract."""

from __future__ import annotations

from pydantic import ValidationError


class InvalidEvent(ValueError):
    """An event that does not satisfy the contract; names the field and the problem."""

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}")

    @classmethod
    def from_validation(cls, exc: ValidationError) -> InvalidEvent:
        """Summarise pydantic's errors: the first names the field, the rest are counted."""
        errors = exc.errors(include_url=False, include_input=False)
        # The discriminated union puts the event type first in the location; drop it.
        def where(err: dict) -> str:
            loc = [str(p) for p in err["loc"]]
            if loc and "." in loc[0]:
                loc = loc[1:]
            return ".".join(loc) or "(event)"

        first = errors[0]
        problem = first["msg"]
        if len(errors) > 1:
            rest = "; ".join(f"{where(e)}: {e['msg']}" for e in errors[1:4])
            problem += f" (and {len(errors) - 1} more: {rest})"
        return cls(where(first), problem)
