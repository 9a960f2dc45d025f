"""What the gateway needs to know, as a structural type.

The shell's ``GatewaySettings`` (pydantic-settings, ``trajlake gateway``)
satisfies it; the package never imports the shell.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol


class GatewayConfig(Protocol):
    bootstrap_servers: str
    topic: str
    upstream_url: str
    """Base URL of the OpenAI-compatible engine, ending in /v1."""
    upstream_api_key: str | None
    upstream_timeout_s: float
    upstream_connect_timeout_s: float
    upstream_retries: int
    gateway_keys: str | None
    gateway_keys_file: Path | None
    allow_anonymous: bool
    spool_dir: Path
    spool_max_bytes: int
    max_body_bytes: int
    tokenizer: str | None
    policy_version: str | None
    request_token_ids: bool
    idempotency_entries: int
    idempotency_ttl_s: float
    broker_timeout_s: float
    redaction_rules: Path | None
    """JSON/TOML rules file of ``ingest.redaction``; None = no redaction."""
    token_sessions: bool
    """Chat calls that extend the rollout's last call go to the engine as token ids (needs ``tokenizer``)."""
    session_max_bytes: int
    session_ttl_s: float
    session_parser: str
    """Tool-call parser of the model family (``hermes``/``qwen``), or ``auto`` (from the chat template)."""
