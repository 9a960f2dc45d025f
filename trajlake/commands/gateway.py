"""``trajlake gateway``: the OpenAI-compatible capture proxy in the foreground."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from trajlake.options import BOOTSTRAP_SERVERS_OPTION, TOPIC_OPTION
from trajlake.settings import CommonSettings
from trajlake.signals import exit_cleanly_on_stop_signals


class GatewaySettings(CommonSettings):
    """The gateway's settings: TRAJLAKE_<FIELD> environment variables, overridden by flags."""

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
    redaction_rules: Optional[Path] = None
    """JSON/TOML file of redaction rules applied before events are sent or spooled (TRAJLAKE_REDACTION_RULES)."""
    token_sessions: bool = False
    """Send chat calls that extend the rollout's last call to the engine as token ids (needs --tokenizer)."""
    session_max_bytes: int = 256 << 20
    """Memory for token sessions (256 MiB); least recently used rollouts are dropped beyond it."""
    session_ttl_s: float = 1800.0
    """A rollout idle this long loses its token session."""
    session_parser: str = "auto"
    """Tool-call format of the served model family: hermes (= qwen), or auto from the chat template."""


def gateway(
    host: str = typer.Option("127.0.0.1", help="Interface to listen on."),
    port: int = typer.Option(8080, min=1, max=65535, help="Port to listen on."),
    upstream: Optional[str] = typer.Option(None, help="Engine base URL, e.g. http://127.0.0.1:8000/v1."),
    tokenizer: Optional[str] = typer.Option(
        None, help="Local HF tokenizer folder of the served model (retokenization fallback, token sessions)."),
    token_sessions: Optional[bool] = typer.Option(
        None, "--token-sessions/--no-token-sessions",
        help="Send chat calls that extend the rollout's last call to the engine as token ids (needs --tokenizer)."),
    spool_dir: Optional[Path] = typer.Option(None, help="Spool folder for events while Kafka is down."),
    policy_version: Optional[str] = typer.Option(None, help="Policy version recorded on every response."),
    keys_file: Optional[Path] = typer.Option(None, help="File of key=tenant lines."),
    redaction_rules: Optional[Path] = typer.Option(None, help="Redaction rules file (.json/.toml)."),
    bootstrap_servers: Optional[str] = BOOTSTRAP_SERVERS_OPTION,
    topic: Optional[str] = TOPIC_OPTION,
) -> None:
    """Run the capture gateway: point any OpenAI client's base URL here and every call lands in the lake.

    SIGTERM or Ctrl-C: in-flight calls finish, events still unsent stay in the spool for the next start; exit 0.
    """
    exit_cleanly_on_stop_signals()
    import uvicorn

    from ingest.gateway import create_gateway_app
    from ingest.gateway.auth import KeyConfigError
    from ingest.gateway.server import GatewayHttpProtocol
    from ingest.spool import SpoolLocked

    overrides = {
        "upstream_url": upstream, "tokenizer": tokenizer, "spool_dir": spool_dir,
        "policy_version": policy_version, "gateway_keys_file": keys_file, "redaction_rules": redaction_rules,
        "bootstrap_servers": bootstrap_servers, "topic": topic, "token_sessions": token_sessions,
    }
    console = Console(stderr=True)
    try:
        settings = GatewaySettings(**{k: v for k, v in overrides.items() if v is not None})
        app = create_gateway_app(settings)
    except (KeyConfigError, SpoolLocked, ValueError) as exc:
        console.print(f"[red]gateway not started:[/] {exc}")
        raise typer.Exit(2) from None
    console.print(
        f"[green]gateway[/] on http://{host}:{port}/v1 -> {settings.upstream_url}; "
        f"events -> {settings.bootstrap_servers} topic {settings.topic}; spool {settings.spool_dir}"
        + (f"; redaction rules {settings.redaction_rules}" if settings.redaction_rules else "")
    )
    uvicorn.run(app, host=host, port=port, access_log=False, log_level="warning", http=GatewayHttpProtocol)


def register(app: typer.Typer) -> None:
    app.command()(gateway)
