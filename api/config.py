"""What the query API needs to know: its options, as a plain model.

``trajlake query-api``'s settings (``QueryApiSettings``) are this model read
from TRAJLAKE_* variables and flags; the package never imports the shell.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from pydantic import Field

from schemas.options import CommonOptions


class QueryApiConfig(CommonOptions):
    """The query API's options (``lake`` comes from ``CommonOptions``)."""

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
