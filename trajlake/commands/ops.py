"""``trajlake forget``, ``trajlake retention show|apply`` and ``trajlake compact``."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from pydantic import Field
from rich import box
from rich.console import Console
from rich.table import Table

from schemas.table_names import DATASETS_PREFIX
from schemas.errors import SettingsInvalid
from trajlake.options import BOOTSTRAP_SERVERS_OPTION, LAKE_OPTION
from trajlake.settings import CommonSettings, load

if TYPE_CHECKING:
    from ingest.topic_retention import TopicRetention
    from store.compact import Compacted
    from store.forget import ForgetReport, ForgetRequest
    from store.lake import Lake
    from store.retention import RetentionPolicy


class OpsSettings(CommonSettings):
    """Settings of the operations commands (TRAJLAKE_* variables; flags win)."""

    retention_days: dict[str, int] = Field(default_factory=dict)
    """Tenant -> days to keep its rollouts, '*' for the default, as JSON (TRAJLAKE_RETENTION_DAYS='{"acme": 30, "*": 365}')."""
    retention_policy: Path | None = None
    """JSON or TOML file with the same mapping (TRAJLAKE_RETENTION_POLICY); wins over TRAJLAKE_RETENTION_DAYS."""
    compact_vacuum_hours: int = Field(default=168, ge=0)
    """Hours a file removed by compaction stays for readers of older snapshots (TRAJLAKE_COMPACT_VACUUM_HOURS)."""

    def policy(self) -> RetentionPolicy:
        """The retention policy of these settings; ``SettingsInvalid`` (exit 2) when it cannot be used."""
        from store.retention import RetentionPolicy

        try:
            if self.retention_policy is not None:
                return RetentionPolicy.from_file(self.retention_policy)
            return RetentionPolicy.parse(self.retention_days)
        except ValueError as exc:
            raise SettingsInvalid(str(exc)) from None


def forget_command(
    tenant: str | None = typer.Option(None, help="Forget this tenant (alone: all of it; with --user/--rollout: the scope)."),
    rollout: list[str] = typer.Option([], help="Forget this rollout id (repeatable)."),
    user: str | None = typer.Option(None, help="Forget the rollouts whose rollout.started metadata has this user (needs --tenant)."),
    reason: str | None = typer.Option(None, help="Why (ticket id); kept in the forget_audit table."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
    lake: str | None = LAKE_OPTION,
    bootstrap_servers: str | None = BOOTSTRAP_SERVERS_OPTION,
    topic: str | None = typer.Option(None, help="Topic of the raw events (TRAJLAKE_TOPIC)."),
) -> None:
    """Delete a tenant's, rollouts' or user's rows from every table, vacuum their files, audit it.

    Not reached: the raw events in the Kafka topic (kept until its retention.ms, asked of --bootstrap-servers) and the predicate of each
    DELETE commit in the tables' _delta_log (it names the tenant and rollout ids; kept until log cleanup)."""
    from ingest.topic_retention import topic_retention
    from store.forget import ForgetRequest, forget

    request = ForgetRequest(tenant=tenant, rollouts=tuple(rollout), user=user, reason=reason)
    settings = load(OpsSettings, lake=lake, bootstrap_servers=bootstrap_servers, topic=topic)
    what = _describe(request)
    if not yes and not typer.confirm(f"permanently delete {what} from {settings.lake}?"):
        raise typer.Exit(code=1)
    store = settings.open_lake()
    report = forget(store, request)
    _render_forget(Console(), report, what, _retrain(store, report))
    _render_not_reached(Console(), topic_retention(settings.bootstrap_servers, settings.topic), datetime.now(timezone.utc))


def retention_show(
    policy: Path | None = typer.Option(None, exists=True, dir_okay=False, help="Policy file (default: TRAJLAKE_RETENTION_POLICY / _DAYS)."),
    lake: str | None = LAKE_OPTION,
    as_json: bool = typer.Option(False, "--json", help="Print JSON lines: tenant ('*': any other), days, expired_rollouts."),
) -> None:
    """Show the retention policy and how many rollouts each tenant has past it."""
    from store.retention import DEFAULT_KEY, expired_rollouts

    settings, parsed = _policy(policy, lake)
    expired = expired_rollouts(settings.open_lake(), parsed, now=datetime.now(timezone.utc))
    if as_json:
        for tenant in sorted(set(expired) | set(parsed.days)):
            print(json.dumps({"tenant": tenant, "days": parsed.days_for(tenant),
                              "expired_rollouts": len(expired.get(tenant, []))}))
        return
    if not parsed.days:
        Console().print("no retention policy: every rollout is kept (set TRAJLAKE_RETENTION_DAYS or --policy)")
        return
    table = Table("tenant", "days", "expired rollouts", title="retention policy", box=box.SIMPLE_HEAD)
    for tenant in sorted(set(expired) | set(parsed.days) - {DEFAULT_KEY}):
        table.add_row(tenant, str(parsed.days_for(tenant)), str(len(expired.get(tenant, []))))
    if DEFAULT_KEY in parsed.days:
        table.add_row("(any other)", str(parsed.days[DEFAULT_KEY]), "")
    Console().print(table)


def retention_apply(
    policy: Path | None = typer.Option(None, exists=True, dir_okay=False, help="Policy file (default: TRAJLAKE_RETENTION_POLICY / _DAYS)."),
    lake: str | None = LAKE_OPTION,
) -> None:
    """Forget every rollout older than its tenant's retention (audited as kind=retention)."""
    from store.retention import apply_retention

    settings, parsed = _policy(policy, lake)
    store = settings.open_lake()
    reports = apply_retention(store, parsed)
    console = Console()
    for report in reports:
        _render_forget(console, report, f"{len(report.rollouts)} expired rollouts of tenant {report.request.tenant}",
                       _retrain(store, report))
    if not reports:
        console.print("nothing past its retention")


def compact_command(
    table: list[str] = typer.Option([], help="Table to compact (repeatable; default: every table of the lake)."),
    vacuum_hours: int | None = typer.Option(None, min=0, help="Keep removed files this many hours (TRAJLAKE_COMPACT_VACUUM_HOURS, default 168)."),
    full: bool = typer.Option(False, "--full", help="Rewrite every file, z-ordered (task_id, rollout_id): costs about "
                              "the lake; by default only the small files written since the last run are rewritten."),
    lake: str | None = LAKE_OPTION,
) -> None:
    """Rewrite the small files written since the last run into few (--full: every file, z-ordered), then vacuum; safe during ingestion.

    The new rows are folded into the pre-joined tables that the llm_calls, tool_steps and rollouts views read."""
    from store.compact import compact

    settings = load(OpsSettings, lake=lake, compact_vacuum_hours=vacuum_hours)
    results = compact(settings.open_lake(), tables=table or None,
                      vacuum_retention=timedelta(hours=settings.compact_vacuum_hours), full=full)
    _render_compacted(Console(), results)


def _policy(policy: Path | None, lake: str | None) -> tuple[OpsSettings, RetentionPolicy]:
    settings = load(OpsSettings, lake=lake, retention_policy=policy)
    return settings, settings.policy()


def _describe(request: ForgetRequest) -> str:
    if request.user is not None:
        return f"the rollouts of user {request.user!r} of tenant {request.tenant!r}"
    if request.rollouts:
        scope = f" of tenant {request.tenant!r}" if request.tenant else ""
        return f"{len(request.rollouts)} rollout(s){scope}"
    return f"every row of tenant {request.tenant!r}"


def _retrain(lake: Lake, report: ForgetReport) -> dict[str, list[str]]:
    """Dataset table -> the checkpoints trained on its versions that held forgotten rollouts."""
    from trainer.records import checkpoints_trained_on

    return {table: checkpoints_trained_on(lake, table.removeprefix("datasets/"), versions)
            for table, versions in report.marked_datasets.items()}


def _render_forget(console: Console, report: ForgetReport, what: str, retrain: dict[str, list[str]]) -> None:
    """The rows deleted per table; the dataset versions (and checkpoints trained on them) to rebuild."""
    table = Table("table", "rows deleted", "files vacuumed", "version", title=f"forgot {what} (forget_id {report.forget_id})",
                  box=box.SIMPLE_HEAD)
    for t in report.tables:
        if t.rows_deleted:
            table.add_row(t.table, f"{t.rows_deleted:,}", str(t.files_vacuumed), f"{t.version_before} -> {t.version_after}")
    console.print(table if report.rows_deleted else f"nothing matched {what}; the request is recorded in forget_audit")
    for table, versions in report.marked_datasets.items():
        dataset = table.removeprefix(DATASETS_PREFIX)
        console.print(f"[yellow]{table}[/] versions {', '.join(map(str, versions))} contained forgotten rollouts: "
                      f"rebuild it (trajlake build-dataset {dataset})")
        if retrain.get(table):
            console.print(f"  checkpoints trained on them (retrain, then delete): {', '.join(retrain[table])}")


def _render_not_reached(console: Console, retention: TopicRetention, now: datetime) -> None:
    """What a forget cannot delete: raw events in Kafka, and the ids in each DELETE commit's predicate."""
    gone = retention.dropped_by(now)
    if gone is not None:
        when = f"gone by {gone.isoformat(timespec='seconds')} (retention.ms={retention.retention_ms}; Kafka drops whole segments, so up to segment.ms later)"
    elif retention.retention_ms is not None:
        when = "kept forever (retention.ms=-1): delete them in Kafka"
    else:
        when = f"retention unknown: {retention.reason}; check retention.ms of the topic"
    console.print(f"[yellow]not reached:[/] raw events stay in Kafka topic {retention.topic} until its retention: {when}")
    console.print("[yellow]not reached:[/] each DELETE commit's commitInfo in the tables' _delta_log names the tenant and rollout ids "
                  "in its predicate (deltalake cannot leave it out) until log cleanup (delta.logRetentionDuration, 30 days by default)")


def _render_compacted(console: Console, results: list[Compacted]) -> None:
    table = Table("table", "removed", "added", "vacuumed", "z-order", "version", title="compaction (files)", box=box.SIMPLE_HEAD)
    for r in results:
        table.add_row(r.table, str(r.files_removed), str(r.files_added), str(r.files_vacuumed),
                      ",".join(r.z_order) or "-", f"{r.version_before} -> {r.version_after}")
    console.print(table if results else "no tables in the lake yet")


def register(app: typer.Typer) -> None:
    app.command("forget")(forget_command)
    app.command("compact")(compact_command)
    retention = typer.Typer(help="Per-tenant retention of rollouts.", no_args_is_help=True)
    retention.command("show")(retention_show)
    retention.command("apply")(retention_apply)
    app.add_typer(retention, name="retention")
