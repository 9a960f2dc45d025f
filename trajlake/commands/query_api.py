"""``trajlake query-api``: the read-only query API (SQL, rollouts, datasets, lineage) in the foreground."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from api.config import QueryApiConfig
from schemas.errors import SettingsInvalid
from trajlake.options import LAKE_OPTION
from trajlake.settings import CommonSettings, load
from trajlake.signals import exit_cleanly_on_stop_signals


class QueryApiSettings(CommonSettings, QueryApiConfig):
    """The query API's settings: ``QueryApiConfig`` and the keys, from TRAJLAKE_<FIELD> variables, overridden by flags."""

    query_api_keys: Optional[str] = None
    """API keys: `key1=tenantA,key2=tenantB` (env TRAJLAKE_QUERY_API_KEYS)."""
    query_api_keys_file: Optional[Path] = None
    """File of `key=tenant` lines, `#` comments (env TRAJLAKE_QUERY_API_KEYS_FILE, flag --keys-file)."""


def query_api(
    host: str = typer.Option("127.0.0.1", help="Interface to listen on."),
    port: int = typer.Option(8090, min=1, max=65535, help="Port to listen on."),
    lake: Optional[str] = LAKE_OPTION,
    keys_file: Optional[Path] = typer.Option(None, help="File of key=tenant lines (TRAJLAKE_QUERY_API_KEYS_FILE)."),
) -> None:
    """Serve read-only SQL, rollouts, datasets and lineage over HTTP; each API key sees only its tenant's rows."""
    exit_cleanly_on_stop_signals()
    import uvicorn

    from ingest.gateway.auth import KeyRing
    from api import create_query_app
    from api.limits import header_limited_h11

    overrides = {"lake": lake, "query_api_keys_file": keys_file}
    console = Console(stderr=True)
    settings = load(QueryApiSettings, **overrides)
    if not settings.query_api_keys and settings.query_api_keys_file is None:
        raise SettingsInvalid("query API not started: no query API keys configured: set "
                              "TRAJLAKE_QUERY_API_KEYS=key=tenant,... or pass --keys-file FILE (lines of key=tenant)")
    try:
        keys = KeyRing.load(env_value=settings.query_api_keys, file=settings.query_api_keys_file,
                            allow_anonymous=False, setting="TRAJLAKE_QUERY_API_KEYS")
        app = create_query_app(settings, keys=keys)
    except ValueError as exc:  # keys that do not parse, limits that contradict each other (KeyConfigError too)
        raise SettingsInvalid(f"query API not started: {exc}") from None
    console.print(f"[green]query API[/] on http://{host}:{port} (schema /openapi.json); lake {settings.lake}; "
                  f"queries stop after {settings.query_timeout_s:g} s, "
                  f"pages hold at most {settings.max_page_rows} rows")
    uvicorn.run(app, host=host, port=port, access_log=False, log_level="warning",
                http=header_limited_h11(settings.max_header_bytes),
                h11_max_incomplete_event_size=settings.max_header_bytes)


def register(app: typer.Typer) -> None:
    app.command(name="query-api")(query_api)
