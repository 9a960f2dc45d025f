"""Settings, read from TRAJLAKE_* environment variables (and CLI flags).

One class per process kind, all built in the command's function and passed
down; nothing here is instantiated at import time.
"""

from __future__ import annotations

from pydantic_settings import BaseSettings, SettingsConfigDict

from schemas.events import DEFAULT_TOPIC


class CommonSettings(BaseSettings):
    """Where the lake and the broker are. Every process needs these."""

    model_config = SettingsConfigDict(env_prefix="TRAJLAKE_", extra="ignore")

    lake: str = "./lake"
    """Lake root: a local folder, or s3://bucket/prefix in production."""
    bootstrap_servers: str = "127.0.0.1:9092"
    """Kafka bootstrap servers (comma-separated)."""
    topic: str = DEFAULT_TOPIC
    """Topic of trajectory events (key = rollout_id)."""
    openlineage_transport: str = "none"
    """Where OpenLineage run events go: none, http (Marquez-compatible), file or console."""
    openlineage_url: str | None = None
    """Lineage server for the http transport, e.g. http://marquez:5000."""
    openlineage_endpoint: str = "api/v1/lineage"
    openlineage_api_key: str | None = None
    """Bearer key for the http transport, when the server wants one."""
    openlineage_file: str | None = None
    """File of the file transport (one JSON event per line, appended)."""
    openlineage_namespace: str = "trajlake"
    """Namespace of trajlake's jobs in the lineage server."""
