"""What the query API needs to know, as a structural type.

The shell's ``QueryApiSettings`` (pydantic-settings, ``trajlake query-api``)
satisfies it; the package never imports the shell.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol


class QueryApiConfig(Protocol):
    lake: str
    """Lake root (local folder or s3://...)."""
    query_timeout_s: float
    """Wall-clock limit of one tenant query."""
    max_sql_chars: int
    """Longest accepted SQL text."""
    default_page_rows: int
    """Rows per page when a request names no limit."""
    max_page_rows: int
    """Row cap of one page, whatever the request asks for."""
    max_body_bytes: int
    """Largest accepted request body."""
    max_result_bytes: int
    """Largest page of a SQL result (Arrow bytes); longer pages are cut short."""
    snapshot_ttl_s: float
    """How long one snapshot of the lake's Delta logs serves queries."""
    query_memory_limit: str
    """DuckDB memory limit of one query, e.g. 1GB."""
    query_threads: int
    """DuckDB threads of one query."""
    max_concurrent_queries: int
    """Queries running at once (one warm worker process each); more are answered 429."""
    max_queries_per_tenant: int | None
    """Queries one tenant may run at once (None: half of ``max_concurrent_queries``); more are answered 429."""
    query_worker_memory_mb: int
    """Address space a query worker may add once warm (RLIMIT_AS); a query past it fails."""
    max_header_bytes: int
    """Largest accepted request line + headers; larger requests are answered 431 (served by ``trajlake query-api``)."""
    viewer_tokenizer: Path | None
    """Local Hugging Face tokenizer folder the viewer decodes token ids with (None: ids)."""
