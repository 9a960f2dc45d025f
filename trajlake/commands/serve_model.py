"""``trajlake serve-model``: the reference OpenAI-compatible upstream (token ids + logprobs)."""

from __future__ import annotations

import asyncio
import socket
from contextlib import AsyncExitStack
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from pydantic_settings import BaseSettings, SettingsConfigDict
from rich.console import Console

from schemas.errors import SettingsInvalid
from trajlake.settings import ShellSettings, load
from trajlake.signals import exit_cleanly_on_stop_signals
from devkit.tiny_model import model_or_tiny

if TYPE_CHECKING:
    import uvicorn
    from fastapi import FastAPI


class ServeModelSettings(BaseSettings):
    """``TRAJLAKE_SERVE_*`` environment variables; the command's flags override them."""

    model_config = SettingsConfigDict(env_prefix="TRAJLAKE_SERVE_", extra="ignore")

    model: Path | None = None
    """A Hugging Face ``save_pretrained`` folder; None: the tiny default model."""
    host: str = "127.0.0.1"
    port: int = 8000
    served_name: str | None = None
    """The ``model`` name clients use; default: the folder's name."""
    policy_version: str | None = None
    """Reported in /v1/models and the x-policy-version header; default: the served name."""
    max_new_tokens: int = 512
    """Cap on a request's max_tokens (tokens)."""
    seed: int = 0
    """Seeds the seeds of requests that bring none (reproducible runs)."""
    threads: int = 1
    """Torch threads per generation: 1 is fastest for small models; raise it for big ones."""


def serve_model(
    model: Path | None = typer.Option(None, "--model", help="HF model folder (save_pretrained). Default: tiny model."),
    host: str | None = typer.Option(None, help="Interface to bind (default: 127.0.0.1)."),
    port: int | None = typer.Option(None, min=0, max=65535, help="Port to listen on (default: 8000)."),
    served_name: str | None = typer.Option(None, help="Model name clients send (default: folder name)."),
    policy_version: str | None = typer.Option(None, help="Policy version to report (default: served name)."),
    max_new_tokens: int | None = typer.Option(None, min=1, help="Cap on max_tokens (default: 512)."),
    seed: int | None = typer.Option(None, help="Seed for requests without one (default: 0)."),
    threads: int | None = typer.Option(None, min=1, help="Torch threads per generation (default: 1)."),
) -> None:
    """Serve a causal LM over an OpenAI-compatible API with vLLM-style token ids and logprobs."""
    exit_cleanly_on_stop_signals()
    import uvicorn

    from serve.app import create_serve_app  # torch/transformers: only when serving

    console = Console()
    flags = {"model": model, "host": host, "port": port, "served_name": served_name,
             "policy_version": policy_version, "max_new_tokens": max_new_tokens, "seed": seed, "threads": threads}
    settings = load(ServeModelSettings, **flags)
    sock, url = _listen(settings.host, settings.port)
    with console.status("building the tiny default model if needed (first run only)"):
        model_dir = Path(model_or_tiny(settings.model, home=load(ShellSettings).home))
    app = create_serve_app(
        model_dir, served_name=settings.served_name, policy_version=settings.policy_version,
        max_new_tokens_cap=settings.max_new_tokens, seed=settings.seed, threads=settings.threads,
    )
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))  # the lifespan runs below
    with asyncio.Runner(loop_factory=server.config.get_loop_factory()) as runner:
        runner.run(_load_and_serve(app, server, sock, console, model_dir=model_dir, url=url))


async def _load_and_serve(app: FastAPI, server: uvicorn.Server, sock: socket.socket, console: Console, *,
                          model_dir: Path, url: str) -> None:
    """Enter the app's lifespan (it loads the model), say where it serves, then serve until stopped.

    The command runs the lifespan itself, not uvicorn, so that a model that does not load is one
    clear line and exit code 2 rather than uvicorn's logged traceback.
    """
    async with AsyncExitStack() as stack:
        try:
            await stack.enter_async_context(app.router.lifespan_context(app))
        except (OSError, ValueError) as exc:
            raise SettingsInvalid(f"cannot load the model: {exc}",
                                  hint="point --model at a Hugging Face model folder or a trajlake checkpoint") from None
        identity = app.state.engine.identity
        console.print(f"[green]serving[/] {model_dir} as [bold]{identity.served_name}[/] "
                      f"(policy {identity.policy_version}, tokenizer {identity.tokenizer}) at [bold]{url}[/]",
                      soft_wrap=True)
        console.print(f"export OPENAI_BASE_URL={url}", highlight=False, soft_wrap=True)
        await server.serve(sockets=[sock])


def _listen(host: str, port: int) -> tuple[socket.socket, str]:
    """A listening socket (bound before the model loads, so a busy port fails fast; 0 = any) and its URL."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        sock = socket.create_server((host, port), family=family)
    except OSError as exc:
        raise SettingsInvalid(f"cannot listen on {host}:{port} ({exc.strerror or exc})",
                              hint="pick another --port (0 = any free port)") from None
    shown = f"[{host}]" if family == socket.AF_INET6 else host
    return sock, f"http://{shown}:{sock.getsockname()[1]}/v1"


def register(app: typer.Typer) -> None:
    app.command(name="serve-model")(serve_model)
