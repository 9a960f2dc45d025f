"""``trajlake build-dataset`` and ``trajlake datasets list|show|diff|export``."""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from schemas.control import CONTROL_TOPIC
from schemas.errors import BrokerUnreachable, InputError
from trajlake.options import BOOTSTRAP_SERVERS_OPTION, LAKE_OPTION, TIME_HELP, first_error, parse_time
from trajlake.settings import CommonSettings, load

if TYPE_CHECKING:
    from kafka import KafkaProducer

    from pipelines.datasets.build import BuildResult
    from store.lake import Lake


class DatasetSettings(CommonSettings):
    """Settings of the dataset commands (TRAJLAKE_* variables; flags win)."""

    build_batch_tokens: int = 4_000_000
    """Prompt + response tokens merged per batch of rollouts: bounds memory (TRAJLAKE_BUILD_BATCH_TOKENS)."""
    control_topic: str = CONTROL_TOPIC
    """Topic of dataset.version events (TRAJLAKE_CONTROL_TOPIC)."""

    @property
    def broker_configured(self) -> bool:
        """Publish only when a broker was named (flag or TRAJLAKE_BOOTSTRAP_SERVERS), not on the default."""
        return "bootstrap_servers" in self.model_fields_set


datasets_app = typer.Typer(help="Versioned training datasets: list, show, diff, export.", no_args_is_help=True)


def build_dataset_command(
    name: str = typer.Argument(..., help="Dataset name: the table datasets/NAME gets a new version."),
    since: str | None = typer.Option(None, help=f"Rollouts started at or after this time ({TIME_HELP})."),
    until: str | None = typer.Option(None, help=f"Rollouts started before this time ({TIME_HELP})."),
    task: list[str] = typer.Option([], help="Task id (repeatable)."),
    tenant: list[str] = typer.Option([], help="Tenant (repeatable)."),
    harness: list[str] = typer.Option([], help="Harness name or name@version (repeatable)."),
    policy_version: list[str] = typer.Option([], help="Served policy version (repeatable)."),
    status: list[str] = typer.Option([], help="Rollout status: succeeded, failed, truncated, cancelled (repeatable)."),
    include_unfinished: bool = typer.Option(False, help="Also use rollouts without a rollout.finished event."),
    where: str | None = typer.Option(None, help="Extra SQL predicate over rollout columns, e.g. \"steps > 2\"."),
    reward_rule: str = typer.Option("latest", help="latest, latest:NAME, sum, mean or weighted:NAME=W,NAME=W."),
    tool_credit: str | None = typer.Option(
        None, help="TOOL=VALUE[,max=N]: add VALUE per run of TOOL that follows a state change (e.g. run_tests=0.1)."),
    mask: str = typer.Option("actions", help="actions (loss on sampled responses) or observations (loss on the "
                             "tool results the harness appended; train with --mode sft)."),
    advantage: str = typer.Option("grpo", help="grpo (mean/std), mean (Dr. GRPO) or raw."),
    group_by: str = typer.Option("group_id", help="Advantage groups: group_id (default: the task) or task_id."),
    drop_degenerate: bool = typer.Option(False, help="Drop rollouts of size-1 / zero-std groups (default: advantage 0)."),
    allow_non_engine: bool = typer.Option(False, help="Train on calls whose tokens were not sampled by the engine."),
    tokenizer: list[str] = typer.Option([], help="Local tokenizer folder: classify sample breaks of its calls by "
                                        "text (repeatable)."),
    batch_tokens: int | None = typer.Option(None, min=1, help="Tokens per merge batch (TRAJLAKE_BUILD_BATCH_TOKENS)."),
    lake: str | None = LAKE_OPTION,
    bootstrap_servers: str | None = BOOTSTRAP_SERVERS_OPTION,
    publish: bool = typer.Option(True, help="Publish dataset.version when a broker is named (--bootstrap-servers or "
                                 "TRAJLAKE_BOOTSTRAP_SERVERS; never to the default one)."),
    as_json: bool = typer.Option(False, "--json", help="Print the manifest as JSON."),
) -> None:
    """Build a new version of datasets/NAME from the lake's rollouts and print its merge statistics."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from pipelines.datasets.config import BuildConfig, RewardRule, Selection, ToolCredit
    from pipelines.lineage.openlineage import open_lineage, traced_build

    settings = load(DatasetSettings, lake=lake, bootstrap_servers=bootstrap_servers, build_batch_tokens=batch_tokens)
    try:
        config = BuildConfig(
            selection=Selection(since=since and parse_time(since, "--since"),
                                until=until and parse_time(until, "--until"), tasks=tuple(task), tenants=tuple(tenant),
                                harnesses=tuple(harness), policy_versions=tuple(policy_version),
                                statuses=tuple(status), include_unfinished=include_unfinished, where=where),
            reward_rule=RewardRule.parse(reward_rule), advantage=advantage, group_by=group_by,
            drop_degenerate=drop_degenerate, allow_non_engine=allow_non_engine,
            batch_tokens=settings.build_batch_tokens,
            tool_credit=ToolCredit.parse(tool_credit) if tool_credit is not None else None, mask=mask,
            tokenizers=tuple(tokenizer),
        )
    except ValueError as exc:  # pydantic's ValidationError included
        raise InputError(first_error(exc)) from None
    for folder in tokenizer:  # before transformers reads a name that is no folder as a Hub repo id
        if not Path(folder).is_dir():
            raise InputError(f"--tokenizer {folder}: no such folder: give a local Hugging Face tokenizer folder "
                             "(with its tokenizer.json)")
    console = Console(stderr=as_json)
    lineage = open_lineage(settings)
    producer = _producer(settings, console) if publish and settings.broker_configured else None
    started = datetime.now(timezone.utc)
    try:
        try:
            with lineage.active(), Progress(TextColumn("merging rollouts"), BarColumn(), MofNCompleteColumn(),
                                            TimeElapsedColumn(), console=Console(stderr=True), transient=True) as bar:
                task_id = bar.add_task("merge", total=None)
                result = traced_build(settings.open_lake(), name, config, producer=producer,
                                      progress=lambda done, total: bar.update(task_id, completed=done, total=total))
        finally:
            if producer is not None:
                producer.close(timeout=5)
        if as_json:
            print(json.dumps(result.manifest, indent=2, sort_keys=True))
            return
        render_manifest(console, result.manifest)
        _render_publish(console, result, settings, asked=publish)
    except KeyboardInterrupt:  # still exit 130 (typer's), but a version committed before the stop is named
        _report_committed_since(settings.open_lake(), name, started)
        raise


def _report_committed_since(lake: Lake, name: str, started: datetime) -> None:
    """After a Ctrl-C: name the versions of ``name`` committed since ``started`` (the registry row is a build's
    commit point), so that the user does not take the stop for 'nothing was built' and build it again."""
    from pipelines.datasets.registry import list_versions

    rows = list_versions(lake, name).to_pylist()
    committed = [r["version"] for r in rows if r["created_at"].replace(tzinfo=r["created_at"].tzinfo or timezone.utc)
                 >= started]
    if committed:
        Console(stderr=True).print(f"stopped by Ctrl-C after {name}@{committed[-1]} was committed: it is in the "
                                   f"registry (trajlake datasets show {name}@{committed[-1]}); its dataset.version "
                                   "may not have been published")


def _producer(settings: DatasetSettings, console: Console) -> KafkaProducer | None:
    from ingest.topics import control_producer

    try:
        return control_producer(settings.bootstrap_servers, settings.control_topic)
    except BrokerUnreachable:
        console.print(f"[yellow]broker {settings.bootstrap_servers} unreachable: building without "
                      "publishing dataset.version[/]")
        return None


def _render_publish(console: Console, result: BuildResult, settings: DatasetSettings, *, asked: bool) -> None:
    if result.published:
        console.print(f"published dataset.version to {settings.control_topic} on {settings.bootstrap_servers}")
    elif result.publish_error:
        console.print(f"[yellow]dataset.version not published: {result.publish_error}[/]")
    elif asked:
        console.print("no broker configured (TRAJLAKE_BOOTSTRAP_SERVERS / --bootstrap-servers): "
                      "built without publishing dataset.version")


def render_manifest(console: Console, manifest: dict[str, Any]) -> None:
    """The readable summary of one dataset version."""
    counts, merge = manifest["counts"], manifest["merge"]
    console.print(f"[bold green]{manifest['dataset']}@{manifest['version']}[/]  hash {manifest['content_hash'][:16]}  "
                  f"built {manifest['built_at'][:19]}  ({manifest['code_version']})")
    console.print(f"reward rule {manifest['reward_rule']}, advantage {manifest['advantage']}, "
                  f"sources " + ", ".join(f"{t}@{v}" for t, v in sorted(manifest["sources"].items())))
    if manifest.get("tool_credit"):
        tool = counts["tool_credit"]
        console.print(f"tool credit {manifest['tool_credit']} after state changes: {tool['credited_runs']:,} of "
                      f"{tool['runs']:,} runs credited, in {tool['rollouts_credited']:,} rollouts")
    if manifest.get("mask") == "observations":
        console.print(f"loss on observations (tool results), not actions: train with --mode sft; "
                      f"{counts['samples_without_observations']:,} samples without an observation left out")
    table = Table(box=box.SIMPLE, show_header=True)
    for column in ("what", "count"):
        table.add_column(column, justify="right" if column == "count" else "left")
    rollouts = counts["rollouts"]
    rows = [
        ("rollouts selected", rollouts["selected"]),
        ("  id used by two tenants (excluded)", rollouts.get("ambiguous_id", 0)),
        ("  without a reward (excluded)", rollouts["without_reward"]),
        ("  degenerate groups dropped", rollouts["degenerate_dropped"]),
        ("  no trained tokens (excluded)", rollouts["without_trained_tokens"]),
        ("  in the dataset", rollouts["in_dataset"]),
        ("groups (singleton / zero std)", f"{counts['groups']['count']} ({counts['groups']['singleton']} / "
                                          f"{counts['groups']['zero_std']})"),
        *[(f"calls {status}", n) for status, n in counts["calls"].items()],
        ("samples", counts["samples"]),
        ("tokens (trained)", f"{counts['tokens']:,} ({counts['trained_tokens']:,})"),
        ("samples per rollout (mean / max)", f"{merge['samples_per_rollout_mean']:.2f} / {merge['samples_per_rollout_max']}"),
        ("single-sample rollouts", f"{merge['single_sample_share']:.1%}"),
        *[(f"merge breaks: {cls}", n) for cls, n in merge["mismatches"].items()],
    ]
    for what, n in rows:
        table.add_row(what, f"{n:,}" if isinstance(n, int) else str(n))
    console.print(table)


def _json_value(value: Any) -> str:
    """Times as RFC 3339 text; anything else JSON does not know as its string."""
    return value.isoformat() if hasattr(value, "isoformat") else str(value)


@datasets_app.command("list")
def list_command(
    name: str | None = typer.Argument(None, help="Only this dataset."),
    lake: str | None = LAKE_OPTION,
    as_json: bool = typer.Option(False, "--json", help="Print JSON lines, one object per version."),
) -> None:
    """Every registered dataset version, oldest first."""
    from pipelines.datasets.registry import list_versions

    rows = list_versions(load(DatasetSettings, lake=lake).open_lake(), name).to_pylist()
    if as_json:
        for r in rows:
            print(json.dumps(r, default=_json_value, sort_keys=True))
        return
    if not rows:
        Console().print("no dataset versions yet: run trajlake build-dataset NAME")
        return
    table = Table(box=box.SIMPLE)
    for column in ("dataset", "version", "created", "samples", "rollouts", "tokens", "trained", "hash"):
        table.add_column(column)
    for r in rows:
        table.add_row(r["dataset"], str(r["version"]), r["created_at"].strftime("%Y-%m-%d %H:%M:%S"),
                      f"{r['n_samples']:,}", f"{r['n_rollouts']:,}", f"{r['n_tokens']:,}",
                      f"{r['n_trained_tokens']:,}", r["content_hash"][:12])
    Console().print(table)


@datasets_app.command("show")
def show_command(
    ref: str = typer.Argument(..., help="NAME or NAME@VERSION."),
    lake: str | None = LAKE_OPTION,
    as_json: bool = typer.Option(False, "--json", help="Print the whole manifest as JSON."),
) -> None:
    """The manifest of one dataset version (latest when no @VERSION)."""
    from pipelines.datasets.registry import get_manifest, parse_ref

    manifest = get_manifest(load(DatasetSettings, lake=lake).open_lake(), *parse_ref(ref))
    if as_json:
        print(json.dumps(manifest, indent=2, sort_keys=True))
    else:
        render_manifest(Console(), manifest)


@datasets_app.command("diff")
def diff_command(
    a: str = typer.Argument(..., help="NAME@VERSION (or NAME: latest)."),
    b: str = typer.Argument(..., help="NAME@VERSION (or NAME: latest)."),
    lake: str | None = LAKE_OPTION,
    as_json: bool = typer.Option(False, "--json", help="Print the diff as one JSON object (each change as a pair: old, new)."),
) -> None:
    """What changed between two dataset versions: content, config, sources, counts, rollouts, rewards."""
    from pipelines.datasets.diff import diff_versions
    from pipelines.datasets.registry import parse_ref

    d = diff_versions(load(DatasetSettings, lake=lake).open_lake(), parse_ref(a), parse_ref(b))
    if as_json:
        print(json.dumps(dataclasses.asdict(d), default=_json_value, indent=2, sort_keys=True))
        return
    console = Console()
    console.print(f"{d.a} -> {d.b}: " + ("[green]same content[/]" if d.same_content else "[yellow]content differs[/]"))
    for title, changes in (("config", d.config_changes), ("sources", d.source_changes), ("counts", d.count_changes)):
        for key, (old, new) in changes.items():
            console.print(f"  {title} {key}: {old} -> {new}")
    for title, ids in (("rollouts added", d.rollouts_added), ("rollouts removed", d.rollouts_removed),
                       ("rewards changed", d.rewards_changed)):
        if ids:
            console.print(f"  {title}: {len(ids)} ({', '.join(ids[:5])}{', ...' if len(ids) > 5 else ''})")


@datasets_app.command("export")
def export_command(
    ref: str = typer.Argument(..., help="NAME or NAME@VERSION."),
    directory: Path = typer.Argument(..., help="Empty (or new) directory for data/train-*.parquet + manifest.json."),
    lake: str | None = LAKE_OPTION,
) -> None:
    """Write a dataset version as plain Parquet (loads with Hugging Face datasets)."""
    from pipelines.datasets.export import export_parquet
    from pipelines.datasets.registry import parse_ref

    name, version = parse_ref(ref)
    try:
        result = export_parquet(load(DatasetSettings, lake=lake).open_lake(), name, directory, version=version)
    except FileExistsError as exc:
        raise InputError(str(exc)) from None
    Console().print(f"exported {name}@{result.version}: {result.rows:,} rows in {len(result.files)} file(s) under "
                    f"{result.directory}/data; load with datasets.load_dataset('parquet', "
                    f"data_files='{result.directory}/data/*.parquet')")


def register(app: typer.Typer) -> None:
    app.command("build-dataset")(build_dataset_command)
    app.add_typer(datasets_app, name="datasets")
