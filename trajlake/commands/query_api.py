"""``trajlake query-api``: the read-only query API (SQL, rollouts, datasets, lineage) in the foreground."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from pydantic import Field
from rich.console import Console

from trajlake.options import LAKE_OPTION
from trajlake.settings import CommonSettings
from trajlake.signals import exit_cleanly_on_stop_signals


class QueryApiSettings(CommonSettings):
    """The query API's settings: TRAJLAKE_<FIELD> environment variables, overridden by flags."""

    query_api_keys: Optional[str] = None
    """API keys: `key1=tenantA,key2=tenantB` (env TRAJLAKE_QUERY_API_KEYS)."""
    query_api_keys_file: Optional[Path] = None
    """File of `key=tenant` lines, `#` comments (env TRAJLAKE_QUERY_API_KEYS_FILE, flag --keys-file)."""
    query_timeout_s: float = Field(10.0, gt=0)
    """Wall-clock limit of one query; longer ones are interrupted."""
    max_sql_chars: int = Field(20_000, ge=1)
    """Longest accepted SQL text."""
    default_page_rows: int = Field(100, ge=1)
    """Rows per page when a request names no limit."""
    max_page_rows: int = Field(1_000, ge=1)
    """Row cap of one page, whatever the request asks for."""
    max_body_bytes: int = Field(64 << 10, ge=1024)
    """Largest accepted request body (64 KiB)."""
    max_result_bytes: int = Field(16 << 20, ge=1024)
    """Largest page of a SQL result in Arrow bytes (16 MiB); longer pages are cut short, next_offset set."""
    snapshot_ttl_s: float = Field(2.0, ge=0)
    """Queries within this many seconds share one read of the Delta logs (may miss newer commits by that long)."""
    query_memory_limit: str = "1GB"
    """DuckDB memory limit of one query (nothing spills to disk)."""
    query_threads: int = Field(2, ge=1)
    """DuckDB threads of one query."""
    max_concurrent_queries: int = Field(4, ge=1)
    """Queries running at once (one warm worker process each); more are answered 429 with Retry-After."""
    max_queries_per_tenant: Optional[int] = Field(None, ge=1)
    """Queries one tenant may run at once (default: half of max_concurrent_queries); more are answered 429."""
    query_worker_memory_mb: int = Field(2048, ge=256)
    """Memory (address space, RLIMIT_AS) a query worker may add once warm; a query past it fails, the server stays."""
    max_header_bytes: int = Field(32 << 10, ge=4096)
    """Largest accepted request line + headers (32 KiB); larger requests are answered 431."""
    viewer_tokenizer: Optional[Path] = None
    """Local Hugging Face tokenizer folder; the viewer decodes token ids with it (ids are shown without)."""


def query_api(
    host: str = typer.Option("127.0.0.1", help="Interface to listen on."),
    port: int = typer.Option(8090, min=1, max=65535, help="Port to listen on."),
    lake: Optional[str] = LAKE_OPTION,
    keys_file: Optional[Path] = typer.Option(None, help="File of key=tenant lines (TRAJLAKE_QUERY_API_KEYS_FILE)."),
) -> None:
    """Serve read-only SQL, rollouts, datasets and lineage over HTTP; each API key sees only its tenant's rows."""
    exit_cleanly_on_stop_signals()
    import uvicorn

    from ingest.gateway.auth import KeyConfigError, KeyRing
    from api import create_query_app
    from api.limits import header_limited_h11

    overrides = {"lake": lake, "query_api_keys_file": keys_file}
    console = Console(stderr=True)
    no_keys = ("no query API keys configured: set TRAJLAKE_QUERY_API_KEYS=key=tenant,... "
               "or pass --keys-file FILE (lines of key=tenant)")
    try:
        settings = QueryApiSettings(**{k: v for k, v in overrides.items() if v is not None})
        if not settings.query_api_keys and settings.query_api_keys_file is None:
            raise KeyConfigError(no_keys)
        keys = KeyRing.load(env_value=settings.query_api_keys, file=settings.query_api_keys_file,
                            allow_anonymous=False)
        app = create_query_app(settings, keys=keys)
    except KeyConfigError as exc:
        console.print(f"[red]query API not started:[/] {exc if 'gateway' not in str(exc) else no_keys}")
        raise typer.Exit(2) from None
    except ValueError as exc:  # settings out of range
        console.print(f"[red]query API not started:[/] {exc}")
        raise typer.Exit(2) from None
    console.print(f"[green]query API[/] on http://{host}:{port} (schema /openapi.json); lake {settings.lake}; "
                  f"queries stop after {settings.query_timeout_s:g} s, "
                  f"pages hold at most {settings.max_page_rows} rows")
    uvicorn.run(app, host=host, port=port, access_log=False, log_level="warning",
                http=header_limited_h11(settings.max_header_bytes),
                h11_max_incomplete_event_size=settings.max_header_bytes)


def register(app: typer.Typer) -> None:
    app.command(name="query-api")(query_api)
