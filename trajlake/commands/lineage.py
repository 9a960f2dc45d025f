"""``trajlake lineage ID``: where a dataset version or checkpoint came from, and what used a rollout or event."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.text import Text
from rich.tree import Tree

from schemas.errors import InputError
from trajlake.options import LAKE_OPTION
from trajlake.settings import CommonSettings, load

if TYPE_CHECKING:
    from pipelines.lineage.trace import Lineage


def lineage_command(
    ref: str = typer.Argument(..., help="NAME@VERSION, checkpoint id, rollout id, event id, or dataset NAME."),
    lake: str | None = LAKE_OPTION,
    limit: int = typer.Option(10, min=0, help="Rollouts and events to list by id (all are counted)."),
    tenant: str | None = typer.Option(
        None, help="Tenant of a rollout or event id (ids are unique per tenant; one several tenants used needs it)."),
    as_json: bool = typer.Option(False, "--json", help="Print the lineage as JSON (every id)."),
    openlineage: bool = typer.Option(False, "--openlineage", help="For a dataset version: print its build as an OpenLineage RunEvent."),
) -> None:
    """Trace an id down to rollouts, events and Kafka offsets, and up to dataset versions and checkpoints."""
    from pipelines.datasets.registry import get_manifest
    from pipelines.lineage.openlineage import run_event
    from pipelines.lineage.trace import lineage

    store = load(CommonSettings, lake=lake).open_lake()
    found = lineage(store, ref, tenant=tenant)
    if openlineage:
        if found.kind not in ("dataset", "checkpoint"):
            raise InputError("--openlineage needs a dataset version (NAME@VERSION) or checkpoint id")
        use = found.datasets[0]
        print(json.dumps(run_event(get_manifest(store, use.dataset, use.version), namespace=store.root), indent=2))
    elif as_json:
        print(json.dumps(to_json(found), indent=2, default=str))
    else:
        Console().print(render(found, limit=limit))


def to_json(found: Lineage) -> dict:
    return {
        "kind": found.kind,
        "subject": found.subject,
        "datasets": [vars(d) for d in found.datasets],
        "checkpoints": [vars(c) for c in found.checkpoints],
        "sources": found.sources,
        "parent_checkpoint": found.parent_checkpoint,
        "base_model": found.base_model,
        "resumes": found.resumes,
        "rollouts": found.rollouts,
        "kafka_offsets": found.offset_ranges(),
        "events": [] if found.events is None else found.events.to_pylist(),
    }


def render(found: Lineage, *, limit: int) -> Tree:
    """A tree: upwards (checkpoints, dataset versions) then downwards (sources, rollouts, events, offsets)."""
    tree = Tree(f"[bold]{found.kind} {found.subject}[/]")
    if found.kind == "checkpoint":
        use = found.datasets[0]
        start = f"checkpoint {found.parent_checkpoint}" if found.parent_checkpoint else f"base model {found.base_model}"
        tree.add(Text(f"trained on {use.dataset}@{use.version} from {start}"))
        resumes = tree.add(f"resumed {len(found.resumes)} time(s)")
        for r in found.resumes:
            resumes.add(Text(f"at step {r['step']} (attempt {r['attempt']}) on {r['host']} pid {r['pid']} at {r['ts']:%Y-%m-%d %H:%M:%S}"))
    if found.checkpoints:
        what = "trained from it" if found.kind == "checkpoint" else ""
        branch = tree.add(f"used by {len(found.checkpoints)} checkpoint(s) {what}".rstrip())
        for c in found.checkpoints:
            branch.add(f"{c.checkpoint_id}  (trained on {c.dataset}@{c.version})")
    if found.kind in ("rollout", "event"):
        branch = tree.add(f"used by {len(found.datasets)} dataset version(s)")
        for d in found.datasets:
            note = "" if d.used_event is None else ("  (this event)" if d.used_event else "  (its rollout, not this event)")
            branch.add(f"{d.dataset}@{d.version}{note}")
    if found.sources:
        tree.add("built from " + ", ".join(f"{t}@{v}" for t, v in sorted(found.sources.items())))
    rollouts = tree.add(f"{len(found.rollouts)} rollout(s)")
    for rollout_id in found.rollouts[:limit]:
        rollouts.add(rollout_id)
    if len(found.rollouts) > limit:
        rollouts.add(f"... {len(found.rollouts) - limit} more (--limit, --json)")
    n_events = 0 if found.events is None else found.events.num_rows
    events = tree.add(f"{n_events} event(s)")
    for r in ([] if found.events is None else found.events.slice(0, limit).to_pylist()):
        events.add(f"{r['type']:<16} {r['event_id']}  {r['kafka_topic']}[{r['kafka_partition']}]@{r['kafka_offset']}")
    offsets = tree.add("kafka offsets")
    for o in found.offset_ranges():
        offsets.add(f"{o['topic']} partition {o['partition']}: {o['first']}..{o['last']} ({o['events']} events)")
    return tree


def register(app: typer.Typer) -> None:
    app.command("lineage")(lineage_command)
