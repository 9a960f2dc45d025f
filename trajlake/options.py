"""Options and help texts every command shares, so one flag reads the same everywhere."""

from __future__ import annotations

from datetime import datetime, timezone

import typer

LAKE_OPTION = typer.Option(
    None, "--lake", help="Lake root: a folder or s3://bucket/prefix (default: TRAJLAKE_LAKE, else ./lake).")
BOOTSTRAP_SERVERS_OPTION = typer.Option(
    None, "--bootstrap-servers", help="Kafka bootstrap servers, host:port[,...] (default: TRAJLAKE_BOOTSTRAP_SERVERS, "
    "else 127.0.0.1:9092).")
TOPIC_OPTION = typer.Option(None, "--topic", help="Events topic (default: TRAJLAKE_TOPIC, else trajlake.events).")

TIME_HELP = "RFC 3339, e.g. 2026-11-01T00:00:00Z; no offset = UTC"
"""How every time option is written (``parse_time`` reads it); a help text ends with it in parentheses."""

EXIT_CODES = (
    "Exit codes: 0 done, or stopped cleanly by SIGTERM / Ctrl-C (services); "
    "1 did not do its job, bad input included: the error on stderr says what to fix; "
    "2 bad flags or settings, nothing was started; "
    "128+N killed by signal N before finishing (one-shot commands)."
)
"""The epilog of every command's --help (added by ``trajlake.cli.build_app``)."""


def parse_time(text: str, flag: str) -> datetime:
    """An RFC 3339 time (a date alone is midnight; no offset means UTC) as an aware datetime.

    >>> parse_time("2026-11-01T06:00:00Z", "--since").isoformat()
    '2026-11-01T06:00:00+00:00'
    """
    from schemas.errors import InputError  # not at import: ``trajlake.cli`` imports this module before any signal handler

    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        raise InputError(f"{flag} {text!r} is not an RFC 3339 time, e.g. 2026-11-01T00:00:00Z "
                         "(a date alone is midnight; no offset = UTC)") from None
    return value if value.tzinfo is not None else value.replace(tzinfo=timezone.utc)


def first_error(exc: ValueError) -> str:
    """One line for a bad option value: pydantic's first error with its field, or the message.

    >>> first_error(ValueError("--since 'x' is not an RFC 3339 time"))
    "--since 'x' is not an RFC 3339 time"
    """
    from pydantic import ValidationError

    if isinstance(exc, ValidationError):
        err = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in err["loc"])
        return f"{where}: {err['msg']}" if where else err["msg"]
    return str(exc)
