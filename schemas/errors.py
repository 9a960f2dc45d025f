"""The error hierarchy: every error a user can meet is a ``TrajlakeError``.

A ``TrajlakeError`` carries a message (what went wrong), a hint (what to do
next) and the exit code ``trajlake`` ends with; the CLI prints ``str(exc)``
(the message, then ``hint: ...`` on a second line when there is one) and exits with ``exit_code``, in one place
(``trajlake.cli``). Packages raise the subclass that names the situation;
each subclass also keeps the builtin base callers catch (``LookupError``,
``ValueError``, ``ConnectionError``...).

>>> str(BrokerUnreachable("127.0.0.1:1"))
'no Kafka broker answers at 127.0.0.1:1: start one (trajlake broker) or point --bootstrap-servers / TRAJLAKE_BOOTSTRAP_SERVERS at yours'
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:  # pydantic loads with the code that validates, not with every import of the errors (``trajlake --help``)
    from pydantic import ValidationError

EXIT_FAILED = 1
"""The command did not do its job (bad input included)."""
EXIT_BAD_SETTINGS = 2
"""Bad flags or settings: nothing was started."""
EXIT_LOG_WENT_BACKWARDS = 3
"""``trajlake ingest``: the log went backwards; rerun with --recover."""


class TrajlakeError(Exception):
    """Base of every error a user can meet: a message, what to do next, and the exit code."""

    exit_code: ClassVar[int] = EXIT_FAILED

    def __init__(self, message: str = "", *, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        """What to do next ("" when the message already says it)."""

    def __str__(self) -> str:
        return f"{self.message}\nhint: {self.hint}" if self.hint else self.message


class InputError(TrajlakeError, ValueError):
    """Input the command cannot use (a bad filter, time, reference or option value); the message names it."""


class SettingsInvalid(TrajlakeError, ValueError):
    """Bad flags, settings or configuration files: nothing was started (exit 2)."""

    exit_code: ClassVar[int] = EXIT_BAD_SETTINGS


class NotFound(TrajlakeError, LookupError):
    """Something the command was asked about does not exist (a table, dataset, rollout, id)."""


class Unreachable(TrajlakeError, ConnectionError):
    """A service the command needs (broker, object store) does not answer."""


class BrokerUnreachable(Unreachable):
    """No Kafka broker answered at the bootstrap servers (at start, on send, or on flush)."""

    def __init__(self, bootstrap_servers: str, what: str | None = None) -> None:
        self.bootstrap_servers = bootstrap_servers
        super().__init__(f"{what + ': ' if what else ''}no Kafka broker answers at {bootstrap_servers}: start one "
                         "(trajlake broker) or point --bootstrap-servers / TRAJLAKE_BOOTSTRAP_SERVERS at yours")


class Conflict(TrajlakeError, RuntimeError):
    """Another writer or process got there first (a race lost, a lease taken, a lock held)."""


class DataError(TrajlakeError, RuntimeError):
    """Stored data is not what it must be (a corrupt table, a log that went backwards)."""


class InvalidEvent(InputError):
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
