"""``trajlake failures`` (failure packets) and ``trajlake compare A B`` (paired harness/policy A/B)."""

from __future__ import annotations

import json
import sys
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from schemas.errors import InputError
from schemas.table_names import FAILURE_PACKETS_TABLE
from trajlake.commands.sql import LAKE_OPTION
from trajlake.options import TIME_HELP, first_error, parse_time
from trajlake.settings import CommonSettings, load

if TYPE_CHECKING:
    from pipelines.datasets.config import Selection
    from pipelines.workbench.compare import Comparison, MetricResult
    from pipelines.workbench.failures import Extraction

PACKET_ID_SHOWN = 11
"""Characters of a packet id the table shows (like a short git hash; --json and the JSONL carry all of it)."""
VERDICT_STYLE = {"B better than A": "bold green", "B worse than A": "bold red", "inside noise": "bold yellow"}


class WorkbenchSettings(CommonSettings):
    """Settings of ``trajlake failures`` and ``trajlake compare`` (TRAJLAKE_* variables; flags win)."""

    compare_resamples: int = 10_000
    """Bootstrap resamples of the tasks (TRAJLAKE_COMPARE_RESAMPLES)."""
    compare_permutations: int = 10_000
    """Sign-flip draws when the test is not exact (TRAJLAKE_COMPARE_PERMUTATIONS)."""
    compare_seed: int = 0
    """Seed of the bootstrap and the permutation test (TRAJLAKE_COMPARE_SEED): same seed, same interval."""


def _utc(text: str | None, flag: str) -> datetime | None:
    """RFC 3339 text as a UTC datetime; without an offset it is taken as UTC."""
    return None if text is None else parse_time(text, flag)


def _selection(*, since: str | None, until: str | None, task: list[str], tenant: list[str],
               where: str | None, **arms: tuple[str, ...]) -> Selection:
    from pipelines.datasets.config import Selection

    return Selection(since=_utc(since, "--since"), until=_utc(until, "--until"), tasks=tuple(task),
                     tenants=tuple(tenant), where=where, **arms)


SINCE = typer.Option(None, help=f"Rollouts started at or after this time ({TIME_HELP}).")
UNTIL = typer.Option(None, help=f"Rollouts started before this time ({TIME_HELP}).")
TASK = typer.Option([], "--task", help="Task id of the task set (repeatable; default: every task).")
TENANT = typer.Option([], "--tenant", help="Tenant (repeatable).")
WHERE = typer.Option(None, help='Extra SQL predicate over rollout columns, e.g. "steps > 2".')
SUCCESS = typer.Option("status", help="When a rollout succeeds: status, reward>=X or status,reward>=X.")
REWARD_RULE = typer.Option("latest", help="Reward of a rollout: latest, latest:NAME, sum, mean, weighted:NAME=W,...")
JSON = typer.Option(False, "--json", help="Print the result as JSON.")


def failures(
    harness: list[str] = typer.Option([], help="Harness NAME or NAME@VERSION (repeatable)."),
    policy_version: list[str] = typer.Option([], help="Served policy version (repeatable)."),
    since: str | None = SINCE,
    until: str | None = UNTIL,
    task: list[str] = TASK,
    tenant: list[str] = TENANT,
    where: str | None = WHERE,
    success: str = SUCCESS,
    reward_rule: str = REWARD_RULE,
    cluster: bool = typer.Option(False, "--cluster", help="One packet per failure cluster instead of per rollout."),
    context: int = typer.Option(4, min=0, max=100, help="Steps kept either side of the failing step."),
    excerpt_chars: int = typer.Option(200, min=0, max=100_000, help="Length of each step's input/output excerpt."),
    output: Path | None = typer.Option(None, "--output", "-o", help="Write the packets as JSONL here (- for stdout)."),
    store: bool = typer.Option(True, help=f"Append the packets to the Delta table {FAILURE_PACKETS_TABLE} (once per extraction)."),
    lake: str | None = LAKE_OPTION,
    as_json: bool = JSON,
) -> None:
    """Compile failure packets for failed or low-reward rollouts: constraints, steps around the failure, outcome."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from pipelines.datasets.config import RewardRule
    from pipelines.datasets.outcomes import SuccessRule
    from pipelines.workbench.failures import FailureConfig, append_packets, extract_failures, packet_lines, write_jsonl

    settings = load(WorkbenchSettings, lake=lake)
    to_stdout = output is not None and str(output) == "-"
    if to_stdout and as_json:
        raise InputError("--json and --output - both write to stdout: pick one (or --output FILE with --json)")
    try:
        config = FailureConfig(
            selection=_selection(since=since, until=until, task=task, tenant=tenant, where=where,
                                 harnesses=tuple(harness), policy_versions=tuple(policy_version)),
            success=SuccessRule.parse(success), reward_rule=RewardRule.parse(reward_rule),
            group="cluster" if cluster else "rollout", context=context, excerpt_chars=excerpt_chars,
        )
    except ValueError as exc:  # pydantic's ValidationError included
        raise InputError(first_error(exc)) from None
    lake_ = settings.open_lake()
    with Progress(TextColumn("reading failed rollouts"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=True) as bar:
        task_id = bar.add_task("read", total=None)
        extraction = extract_failures(
            lake_, config, progress=lambda done, total: bar.update(task_id, completed=done, total=total))
    version = append_packets(lake_, extraction) if store else None
    if to_stdout:
        sys.stdout.write("".join(line + "\n" for line in packet_lines(extraction)))
    elif output is not None:
        try:
            write_jsonl(extraction, output)
        except OSError as exc:
            raise InputError(f"cannot write {output}: {exc.strerror or exc}; pick a writable --output path") from None
    if as_json:
        print(json.dumps(_extraction_summary(extraction, stored=store, version=version, output=output), indent=2))
    else:  # with --output - the packets own stdout, so the summary goes to stderr
        _render_extraction(Console(stderr=to_stdout), extraction, stored=store, version=version,
                           output=None if to_stdout else output)


def _extraction_summary(x: Extraction, *, stored: bool, version: int | None, output: Path | None) -> dict:
    return {
        "extraction_id": x.extraction_id, "selected": x.selected, "failed": x.failed, "packets": len(x.packets),
        "group": x.config.group, "success": x.config.success.describe(), "table": FAILURE_PACKETS_TABLE if stored else None,
        "table_version": version, "already_stored": stored and version is None,
        "output": None if output is None else str(output),
        "packet_ids": [p.packet_id for p in x.packets],
    }


def _render_extraction(console: Console, x: Extraction, *, stored: bool, version: int | None,
                       output: Path | None) -> None:
    from pipelines.workbench.failure_packets import RolloutPacket

    console.print(f"{x.failed} of {x.selected} selected rollouts did not succeed "
                  f"(success = {x.config.success.describe()}): {len(x.packets)} {x.config.group} packet(s)")
    if x.packets:
        table = Table(box=box.SIMPLE_HEAVY, show_edge=False)
        table.add_column("n", justify="right", no_wrap=True)
        for name in ("harness", "status"):
            table.add_column(name, no_wrap=True)
        table.add_column("failing step: error or finish reason", ratio=1)
        table.add_column("packet", no_wrap=True)
        for p in x.packets:
            sig = p.signature
            step = p.failing_step if isinstance(p, RolloutPacket) else p.example.failing_step
            where = "-" if step is None else f"{sig.failing_tool or step.kind} #{step.seq}"
            table.add_row(str(1 if isinstance(p, RolloutPacket) else p.rollouts),
                          f"{sig.harness.name}@{sig.harness.version}", sig.status,
                          f"{where}: {sig.error or f'finish {sig.finish_reason}'}", p.packet_id[:PACKET_ID_SHOWN])
        console.print(table)
    console.print(f"extraction {x.extraction_id}")
    if stored:
        console.print(f"table {FAILURE_PACKETS_TABLE}: " + (f"version {version}" if version is not None
                                             else "already holds this extraction (nothing written)"))
    if output is not None:
        console.print(f"JSONL: {output}")


def compare_command(
    a: str = typer.Argument(..., help="Arm A (the baseline): harness NAME@VERSION, or a policy version with --by policy."),
    b: str = typer.Argument(..., help="Arm B (the change)."),
    by: str = typer.Option("harness", help="What the arms name: harness (NAME@VERSION or NAME) or policy (version)."),
    harness: list[str] = typer.Option([], help="With --by policy: only rollouts of this harness, NAME or NAME@VERSION (repeatable)."),
    policy_version: list[str] = typer.Option([], help="With --by harness: only rollouts of this policy version (repeatable)."),
    since: str | None = SINCE,
    until: str | None = UNTIL,
    task: list[str] = TASK,
    tenant: list[str] = TENANT,
    where: str | None = WHERE,
    success: str = SUCCESS,
    reward_rule: str = REWARD_RULE,
    primary: str = typer.Option("success", help="Metric of the headline verdict: success or reward."),
    confidence: float = typer.Option(0.95, help="Confidence level of the intervals."),
    alpha: float = typer.Option(0.05, help="Significance level of the test and of the power calculation."),
    power: float = typer.Option(0.8, help="Power for the tasks-needed estimate."),
    resamples: int | None = typer.Option(None, help="Bootstrap resamples (TRAJLAKE_COMPARE_RESAMPLES, default 10000)."),
    seed: int | None = typer.Option(None, help="Seed of bootstrap and permutations (TRAJLAKE_COMPARE_SEED, default 0)."),
    lake: str | None = LAKE_OPTION,
    as_json: bool = JSON,
) -> None:
    """Compare B against A on the tasks both ran: success rate and mean reward, paired by task, with CI and p-value."""
    from pipelines.datasets.config import RewardRule
    from pipelines.datasets.outcomes import SuccessRule
    from pipelines.workbench.compare import Arm, CompareConfig, compare

    settings = load(WorkbenchSettings, lake=lake, compare_resamples=resamples, compare_seed=seed)
    try:
        if by not in ("harness", "policy"):
            raise ValueError(f"--by {by!r}: use harness or policy")
        if (by == "harness" and harness) or (by == "policy" and policy_version):
            raise ValueError(f"the arms already name the {by}: filter by --{'policy-version' if harness else 'harness'} "
                             f"instead of --{'harness' if harness else 'policy-version'}")
        arm_a, arm_b = Arm.parse(a, by), Arm.parse(b, by)  # type: ignore[arg-type]
        config = CompareConfig(
            selection=_selection(since=since, until=until, task=task, tenant=tenant, where=where,
                                 harnesses=tuple(harness), policy_versions=tuple(policy_version)),
            success=SuccessRule.parse(success), reward_rule=RewardRule.parse(reward_rule), primary=primary,
            confidence=confidence, alpha=alpha, power=power, resamples=settings.compare_resamples,
            permutations=settings.compare_permutations, seed=settings.compare_seed,
        )
    except ValueError as exc:  # pydantic's ValidationError included
        raise InputError(first_error(exc)) from None
    result = compare(settings.open_lake(), arm_a, arm_b, config)
    if as_json:
        print(result.model_dump_json(indent=2))
        return
    render_comparison(Console(), result)


def render_comparison(console: Console, r: Comparison) -> None:
    """Arms, one column per metric (rows: the statistics) and the verdict sentence."""
    c = r.config
    for side, arm in (("A", r.a), ("B", r.b)):
        console.print(Text.assemble((f"{side}  ", "bold"), (arm.label, "bold"),
                                    f"   {arm.rollouts} rollouts on {arm.tasks} tasks"))
    console.print(f"paired by task on {r.shared_tasks} shared tasks · success = {c.success.describe()} · "
                  f"reward = {c.reward_rule.describe()} · seed {c.seed}")
    metrics = [m for m in (r.success, r.reward) if m is not None]
    table = Table(box=box.SIMPLE_HEAVY, show_edge=False)
    table.add_column("")
    for m in metrics:
        table.add_column("success rate" if m.name == "success" else "mean reward", justify="right")
    level = f"{c.confidence:.0%}"
    rows = [("tasks paired", lambda m: str(m.tasks)), (f"A  {r.a.label}", lambda m: _value(m, m.a)),
            (f"B  {r.b.label}", lambda m: _value(m, m.b)), ("B - A", lambda m: _diff(m, m.diff)),
            (f"{level} CI, paired bootstrap", lambda m: _interval(m, m.ci)),
            (f"{level} CI, normal approx.", lambda m: _interval(m, m.normal_ci)),
            ("p, sign-flip test", lambda m: _p(m.p_value).removeprefix("= ")),
            (f"tasks for {c.power:.0%} power", lambda m: "-" if m.tasks_needed is None else f"{m.tasks_needed:,}"),
            ("verdict", lambda m: Text(m.verdict, style=VERDICT_STYLE[m.verdict]))]
    for name, show in rows:
        table.add_row(name, *(show(m) for m in metrics))
    console.print(table)
    console.print(_verdict_line(r))


def _value(m: MetricResult, x: float) -> str:
    return f"{x:.1%}" if m.name == "success" else f"{x:.3f}"


def _diff(m: MetricResult, x: float) -> str:
    return f"{x * 100:+.1f} pp" if m.name == "success" else f"{x:+.3f}"


def _interval(m: MetricResult, ci: tuple[float, float]) -> str:
    if m.name == "success":
        return f"[{ci[0] * 100:+.1f}, {ci[1] * 100:+.1f}] pp"
    return f"[{ci[0]:+.3f}, {ci[1]:+.3f}]"


def _p(p: float) -> str:
    return "< 0.0001" if p < 0.0001 else f"= {p:.4f}"


def _verdict_line(r: Comparison) -> Text:
    m = r.success if r.config.primary == "success" or r.reward is None else r.reward
    what = "success rate" if m.name == "success" else "mean reward"
    effect = _diff(m, m.diff)
    text = Text.assemble(("verdict: ", "bold"), (m.verdict, VERDICT_STYLE[m.verdict]),
                         f" ({r.b.label} vs {r.a.label}: {what} {effect}, p {_p(m.p_value)}")
    if m.tasks_needed is None:
        text.append("; no difference at all)" if m.diff == 0 else "; one task cannot tell noise from effect)")
    elif m.verdict == "inside noise":
        text.append(f"; detecting {effect} at {r.config.power:.0%} power needs ~{m.tasks_needed:,} tasks, "
                    f"{m.tasks} were paired)")
    else:
        text.append(")")
    return text


def register(app: typer.Typer) -> None:
    app.command("failures")(failures)
    app.command("compare")(compare_command)
