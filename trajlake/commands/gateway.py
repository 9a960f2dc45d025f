"""``trajlake gateway``: the OpenAI-compatible capture proxy in the foreground."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from ingest.gateway.config import GatewayConfig
from schemas.errors import SettingsInvalid, TrajlakeError
from trajlake.options import BOOTSTRAP_SERVERS_OPTION, TOPIC_OPTION
from trajlake.settings import CommonSettings, load
from trajlake.signals import exit_cleanly_on_stop_signals


class GatewaySettings(CommonSettings, GatewayConfig):
    """The gateway's settings: ``GatewayConfig`` from TRAJLAKE_<FIELD> environment variables, overridden by flags."""


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
    from ingest.gateway.server import GatewayHttpProtocol

    overrides = {
        "upstream_url": upstream, "tokenizer": tokenizer, "spool_dir": spool_dir,
        "policy_version": policy_version, "gateway_keys_file": keys_file, "redaction_rules": redaction_rules,
        "bootstrap_servers": bootstrap_servers, "topic": topic, "token_sessions": token_sessions,
    }
    console = Console(stderr=True)
    try:
        settings = load(GatewaySettings, **overrides)
        app = create_gateway_app(settings)
    except (TrajlakeError, ValueError) as exc:  # keys, spool, redaction rules, upstream URL: nothing started
        raise SettingsInvalid(f"gateway not started: {exc}") from None
    console.print(
        f"[green]gateway[/] on http://{host}:{port}/v1 -> {settings.upstream_url}; "
        f"events -> {settings.bootstrap_servers} topic {settings.topic}; spool {settings.spool_dir}"
        + (f"; redaction rules {settings.redaction_rules}" if settings.redaction_rules else "")
    )
    uvicorn.run(app, host=host, port=port, access_log=False, log_level="warning", http=GatewayHttpProtocol)


def register(app: typer.Typer) -> None:
    app.command()(gateway)
