"""Options every process shares: where the lake and the broker are.

The packages' option models (``ingest.ingester.IngesterConfig``,
``ingest.gateway.config.GatewayConfig``, ``api.config.QueryApiConfig``)
extend ``CommonOptions``; the shell's settings (``trajlake.settings``) add the
environment to the same models, so each option is declared once.
"""

from __future__ import annotations

from pydantic import BaseModel

from schemas.option_defaults import DEFAULT_LAKE, DEFAULT_TOPIC


class CommonOptions(BaseModel):
    """Where the lake and the broker are (TRAJLAKE_LAKE, TRAJLAKE_BOOTSTRAP_SERVERS, TRAJLAKE_TOPIC in the shell)."""

    lake: str = DEFAULT_LAKE
    """Lake root: a local folder, or s3://bucket/prefix in production."""
    bootstrap_servers: str = "127.0.0.1:9092"
    """Kafka bootstrap servers (comma-separated)."""
    topic: str = DEFAULT_TOPIC
    """Topic of trajectory events (key = rollout_id)."""
