"""``trajlake rollout show ID``: one trajectory in order, for people (or as JSON)."""

from __future__ import annotations

from typing import Any

import typer
from rich import box
from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from store.trajectory import (
    EXCERPT_CHARS,
    LlmCallStep,
    RewardStep,
    RolloutEndStep,
    RolloutStartStep,
    RolloutSummary,
    ToolStep,
    Trajectory,
    load_trajectory,
)
from trajlake.commands.sql import LAKE_OPTION, cell, utc_text
from trajlake.settings import SqlSettings, load

STATUS_STYLE = {"succeeded": "green", "failed": "red", "truncated": "yellow", "cancelled": "yellow", "running": "cyan"}

rollout_app = typer.Typer(help="Inspect rollouts (one attempt at one task).", no_args_is_help=True)


@rollout_app.command()
def show(
    rollout_id: str = typer.Argument(..., help="The rollout id (trajlake sql \"SELECT rollout_id FROM rollouts\" lists them)."),
    lake: str | None = LAKE_OPTION,
    tenant: str | None = typer.Option(None, "--tenant", help="Tenant of the rollout, when the id exists in several."),
    excerpt_chars: int = typer.Option(EXCERPT_CHARS, "--excerpt-chars", min=0, help="Length of prompt/response/tool excerpts."),
    as_json: bool = typer.Option(False, "--json", help="Print the trajectory as JSON instead of a table."),
) -> None:
    """Print one rollout in order: start, LLM calls (tokens, latency, finish), tools, rewards, finish."""
    store = load(SqlSettings, lake=lake).open_lake()
    trajectory = load_trajectory(store, rollout_id, tenant=tenant, excerpt_chars=excerpt_chars)
    if as_json:
        typer.echo(trajectory.model_dump_json(indent=2))
        return
    Console().print(render(trajectory))


def render(trajectory: Trajectory) -> Group:
    """The summary panel and the table of steps."""
    steps = Table(box=box.SIMPLE_HEAVY, show_edge=False, expand=True)
    steps.add_column("seq", justify="right")
    steps.add_column("at", justify="right", no_wrap=True)
    steps.add_column("step", no_wrap=True)
    steps.add_column("detail", ratio=1, overflow="fold")
    t0 = trajectory.steps[0].ts if trajectory.steps else None
    for step in trajectory.steps:
        at = f"+{(step.ts - t0).total_seconds():.1f}s" if t0 else ""
        steps.add_row(str(step.seq), at, Text(step.kind, style="bold"), _detail(step))
    return Group(_summary_panel(trajectory.summary), steps)


def _summary_panel(s: RolloutSummary) -> Panel:
    harness = f"{s.harness_name or '?'} {s.harness_version or ''}".strip()
    if s.harness_config_hash:
        harness += f" (config {s.harness_config_hash})"
    reward = "none yet" if s.reward is None else f"{s.reward:.6g} from {s.n_rewards} reward event(s)"
    lines = [
        ("task", f"{s.task_id}   group {s.group_id}   attempt {s.attempt}   tenant {s.tenant}"),
        ("harness", harness),
        ("policy", s.policy_version or "unknown"),
        ("status", Text(s.status + (f": {s.reason}" if s.reason else ""), style=STATUS_STYLE.get(s.status, ""))),
        ("time", f"{_ts(s.started_at)} -> {_ts(s.finished_at)}"),
        ("calls", f"{s.n_llm_calls} LLM ({s.n_llm_errors} failed), {s.n_tool_calls} tool ({s.n_tool_errors} failed)"),
        ("tokens", f"{s.n_prompt_tokens:,} prompt, {s.n_response_tokens:,} response"),
        ("reward", reward),
    ]
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    for name, value in lines:
        grid.add_row(name, value)
    return Panel(grid, title=f"rollout {s.rollout_id}", title_align="left")


def _detail(step: Any) -> Text:
    if isinstance(step, LlmCallStep):
        return _llm_detail(step)
    if isinstance(step, ToolStep):
        return _tool_detail(step)
    if isinstance(step, RewardStep):
        return Text(f"{step.name} = {step.value:.6g}" + (f" ({step.source})" if step.source else ""), style="magenta")
    if isinstance(step, RolloutStartStep):
        return Text(f"group {step.group_id}, policy {step.policy_version or 'unknown'}")
    if isinstance(step, RolloutEndStep):
        text = step.status + (f": {step.reason}" if step.reason else "")
        text += f" ({step.steps} steps)" if step.steps is not None else ""
        return Text(text, style=STATUS_STYLE.get(step.status, ""))
    raise TypeError(f"unknown step {step!r}")


def _llm_detail(step: LlmCallStep) -> Text:
    parts = [step.model or "model ?", f"{cell(step.n_prompt_tokens)} -> {cell(step.n_response_tokens)} tokens"]
    if step.token_source:
        parts[-1] += f" ({step.token_source})"
    if step.latency_ms is not None:
        parts.append(f"{step.latency_ms:.0f} ms")
    if step.finish_reason:
        parts.append(f"finish {step.finish_reason}")
    if step.upstream_retries:
        parts.append(f"{step.upstream_retries} retries")
    text = Text(" · ".join(parts) + f"  [{step.call_id}]")
    if not step.has_response:
        text.append("  no response yet", style="yellow")
    if step.error:
        text.append(f"  error: {step.error}", style="red")
    if step.prompt_excerpt:
        text.append(f"\n> {step.prompt_excerpt}", style="dim")
    if step.text_excerpt:
        text.append(f"\n< {step.text_excerpt}", style="cyan")
    return text


def _tool_detail(step: ToolStep) -> Text:
    text = Text(f"{step.name}({step.arguments_excerpt or ''})  [{step.call_id}]")
    if step.duration_ms is not None:
        text.append(f" · {step.duration_ms:.0f} ms")
    if step.state_changed is not None:
        text.append(" · state changed" if step.state_changed else " · no state change")
    if not step.has_result:
        text.append("  no result yet", style="yellow")
    if step.error:
        text.append(f"  error: {step.error}", style="red")
    if step.result_excerpt:
        text.append(f"\n= {step.result_excerpt}", style="dim")
    return text


def _ts(ts: Any) -> str:
    return "?" if ts is None else utc_text(ts)


def register(app: typer.Typer) -> None:
    app.add_typer(rollout_app, name="rollout")
