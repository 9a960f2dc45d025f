"""What the gateway needs to know: its options, as a plain model.

``trajlake gateway``'s settings (``GatewaySettings``) are this model read from
TRAJLAKE_* variables and flags; the package never imports the shell.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional

from pydantic import PositiveInt

from schemas.options import CommonOptions


class GatewayConfig(CommonOptions):
    """The gateway's options (``bootstrap_servers`` and ``topic`` come from ``CommonOptions``)."""

    upstream_url: str = "http://127.0.0.1:8000/v1"
    """Base URL of the OpenAI-compatible engine (vLLM, SGLang, `trajlake serve-model`), ending in /v1."""
    upstream_api_key: Optional[str] = None
    """Sent to the engine as a bearer token (clients' keys are never forwarded)."""
    upstream_timeout_s: float = 600.0
    """Longest wait for an engine answer (a long generation can take minutes)."""
    upstream_connect_timeout_s: float = 5.0
    upstream_retries: int = 2
    """Retries of calls the engine refused without generating (connect errors, 502/503/504)."""
    gateway_keys: Optional[str] = None
    """API keys: `key1=tenantA,key2=tenantB` (env TRAJLAKE_GATEWAY_KEYS)."""
    gateway_keys_file: Optional[Path] = None
    """File of `key=tenant` lines (env TRAJLAKE_GATEWAY_KEYS_FILE)."""
    allow_anonymous: bool = False
    """Development only: accept calls without a key, as tenant `default`."""
    spool_dir: Path = Path("./gateway-spool")
    """Durable on-disk buffer for events while Kafka is unreachable."""
    spool_max_bytes: int = 1 << 30
    """Spool capacity (1 GiB); when full, new events are dropped loudly (log + metric + /readyz 503)."""
    max_body_bytes: int = 16 << 20
    """Largest accepted request body (16 MiB)."""
    tokenizer: Optional[str] = None
    """Local HF tokenizer folder, used only when the engine returns no token ids."""
    policy_version: Optional[str] = None
    """Recorded on every llm.response; default: the model name the engine served."""
    request_token_ids: bool = True
    """Ask the engine for token ids and logprobs; turn off for engines that refuse unknown fields."""
    idempotency_entries: int = 10_000
    """Keyed calls remembered for replay (in-process LRU)."""
    idempotency_ttl_s: float = 600.0
    broker_timeout_s: float = 5.0
    """Longest wait for a Kafka acknowledgement before events go to the spool."""
    kafka_compression: Literal["zstd", "gzip", "none"] = "zstd"
    """Codec of the record batches the gateway produces (``compression.type``). zstd, measured on bench/sessions
    (one call's two events per batch, as the broker stores them): 2.0x fewer bytes than the uncompressed events
    with references, 4.2x with full events. Every reader of the topic must decode it: the ingester (librdkafka)
    and its log probe (kafka-python, with the pinned ``zstandard``) do. lz4 is left out (kafka-python readers
    would need another package; 1.4x the bytes of zstd on those events); none: for readers that cannot decode."""
    compact_logprobs: bool = True
    """Write ``llm.response`` logprobs as base64 float32 where exact (an engine's float32 values; others stay JSON
    numbers; ``schemas.compact_logprobs``): measured on bench/sessions with real engine logprobs, 1.22x fewer
    stored Kafka bytes per rollout after zstd. Off for readers older than the compact form (they quarantine it)."""
    redaction_rules: Optional[Path] = None
    """JSON/TOML file of redaction rules applied before events are sent or spooled (TRAJLAKE_REDACTION_RULES)."""
    token_sessions: bool = False
    """Send chat calls that extend the rollout's last call to the engine as token ids (needs ``tokenizer``)."""
    session_max_bytes: int = 256 << 20
    """Memory for token sessions (256 MiB); least recently used rollouts are dropped beyond it."""
    session_ttl_s: float = 1800.0
    """A rollout idle this long loses its token session."""
    prefix_references: bool = True
    """A chat call of a rollout is recorded as a reference to the rollout's last call plus only what is new
    (schemas/EVENTS.md): the messages after the ones it shares with that call (compared exactly), its tools
    when equal, and with token sessions the prompt ids after the shared prefix (compared id by id); off: every
    llm.request carries its full messages, tools and prompt (for readers older than references)."""
    history_max_bytes: PositiveInt = 64 << 20
    """Memory for the message digests of each rollout's last call (64 MiB, about 60 bytes a message), which
    messages references compare with; least recently used rollouts are dropped beyond it (TTL: session_ttl_s)."""
    session_parser: str = "auto"
    """Tool-call format of the served model family: hermes (= qwen), or auto from the chat template."""
