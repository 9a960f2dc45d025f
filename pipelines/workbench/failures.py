"""Failure packets: what went wrong in failed or low-reward rollouts, ready to read.

``extract_failures`` selects rollouts (the dataset pipeline's filters: task
set, harness, policy, time window, ``where``), keeps those that did not
succeed under the ``SuccessRule`` (``status``: not succeeded;
``reward>=X``: low reward), reads each one's trajectory
(``store.trajectory.load_trajectory``) and compiles one packet per rollout,
or one per failure cluster (rollouts with the same ``Signature``: harness
identity, status and reason, failing tool, normalised error, finish reason).

Deterministic: rollouts are taken in rollout_id order, clusters by size then
signature, and nothing in a packet comes from the wall clock. The
``extraction_id`` hashes the config and the packet ids, so the same inputs
give the same id; ``append_packets`` stores an extraction once (a Delta
transaction marker named after it) and ``write_jsonl`` writes the same bytes.

>>> extraction = extract_failures(lake, FailureConfig(selection=Selection(harnesses=("swe@1.5",))))  # doctest: +SKIP
>>> write_jsonl(extraction, "failures.jsonl")  # doctest: +SKIP
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel, ConfigDict, Field

from pipelines.datasets.config import RewardRule, Selection
from pipelines.workbench.failure_packets import (
    ClusterPacket,
    RolloutPacket,
    build_packet,
    canonical_json,
    content_id,
    first_messages,
    with_id,
)
from pipelines.datasets.outcomes import SuccessRule, select_outcomes
from schemas.tables import FAILURE_PACKETS, FAILURE_PACKETS_TABLE, LLM_REQUESTS_TABLE
from store.lake import Lake
from store.sql import check_lake, connect
from store.trajectory import EXCERPT_CHARS, load_trajectory
from schemas.errors import NotFound

Progress = Callable[[int, int], None]


class FailureConfig(BaseModel):
    """Which rollouts count as failures and how packets are cut (all of it goes into the extraction id)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    selection: Selection = Field(default_factory=Selection)
    success: SuccessRule = Field(default_factory=SuccessRule)
    """Rollouts that do NOT succeed under this rule get packets."""
    reward_rule: RewardRule = Field(default_factory=RewardRule)
    group: Literal["rollout", "cluster"] = "rollout"
    context: int = Field(default=4, ge=0, le=100)
    """Steps kept either side of the failing step."""
    excerpt_chars: int = Field(default=EXCERPT_CHARS, ge=0, le=100_000)
    """Length of each step's input/output excerpt."""
    constraint_chars: int = Field(default=2000, ge=0, le=100_000)
    """Length of each constraint message (first system / user message)."""


class Extraction(BaseModel):
    """One run's packets, the id that names them and what was selected."""

    model_config = ConfigDict(frozen=True)

    extraction_id: str
    config: FailureConfig
    selected: int
    """Rollouts the selection matched."""
    failed: int
    """Of those, rollouts that did not succeed (each is in exactly one packet)."""
    packets: list[RolloutPacket | ClusterPacket]


class NothingSelected(NotFound):
    """The filters matched no finished rollout."""


def extract_failures(lake: Lake, config: FailureConfig, *, progress: Progress | None = None) -> Extraction:
    """Packets for the selection's failed rollouts (``NothingSelected`` when it matches nothing)."""
    check_lake(lake)
    con = connect(lake, sandbox=True)  # the --where predicate is user SQL: no file access
    try:
        outcomes = select_outcomes(con, config.selection, success=config.success, reward_rule=config.reward_rule)
        failed = outcomes.filter(pc.invert(outcomes.column("success")))
        requests = _request_facts(con, failed.column("rollout_id").to_pylist(), config.constraint_chars)
        if outcomes.num_rows == 0:
            raise NothingSelected("no finished rollout matches the filters: check --harness/--task/--since/--until "
                                  "(trajlake sql \"SELECT harness_name, harness_version, count(*) FROM rollouts "
                                  "GROUP BY ALL\" lists what the lake holds)")
        packets: list[RolloutPacket] = []
        for i, row in enumerate(failed.select(["rollout_id", "tenant", "reward"]).to_pylist()):
            trajectory = load_trajectory(lake, row["rollout_id"], tenant=row["tenant"],
                                         excerpt_chars=config.excerpt_chars, con=con)
            constraints, retries = requests.get(row["rollout_id"], ([], 0))
            packets.append(build_packet(trajectory, reward=row["reward"], constraints=constraints,
                                        harness_retries=retries, context=config.context))
            if progress is not None:
                progress(i + 1, failed.num_rows)
    finally:
        con.close()
    grouped = packets if config.group == "rollout" else cluster(packets)
    identity = {"config": config.model_dump(mode="json"), "packets": [p.packet_id for p in grouped]}
    return Extraction(extraction_id=content_id(identity, "fx"), config=config, selected=outcomes.num_rows,
                      failed=failed.num_rows, packets=grouped)


def _request_facts(
    con: duckdb.DuckDBPyConnection, rollout_ids: list[str], chars: int
) -> dict[str, tuple[list[dict[str, str]], int]]:
    """rollout_id -> (first system/user messages of its first LLM request, harness retries).

    A harness retry is a request with a new call id and an idempotency key
    seen before in the rollout (resent events with the same call id are not).
    """
    if not rollout_ids:
        return {}
    rows = con.execute(
        f"""SELECT rollout_id, arg_min(messages, (seq, ts, event_id)) AS messages,
                  arg_min(prompt, (seq, ts, event_id)) AS prompt,
                  count(DISTINCT call_id) FILTER (WHERE idempotency_key IS NOT NULL)
                      - count(DISTINCT idempotency_key) AS harness_retries
           FROM {LLM_REQUESTS_TABLE} WHERE rollout_id IN (SELECT unnest(?)) GROUP BY rollout_id""",
        [rollout_ids],
    ).fetchall()
    return {rid: (first_messages(messages, prompt, chars=chars), retries)
            for rid, messages, prompt, retries in rows}


def cluster(packets: list[RolloutPacket]) -> list[ClusterPacket]:
    """One packet per signature, largest cluster first (ties by signature); example = first rollout id."""
    groups: dict[str, list[RolloutPacket]] = defaultdict(list)
    for packet in packets:
        groups[canonical_json(packet.signature.model_dump(mode="json"))].append(packet)
    clusters = []
    for key in sorted(groups, key=lambda k: (-len(groups[k]), k)):
        members = sorted(groups[key], key=lambda p: (p.rollout_id, p.tenant))
        rewards = [p.outcome.reward for p in members if p.outcome.reward is not None]
        clusters.append(with_id(
            ClusterPacket, signature=members[0].signature, rollouts=len(members),
            rollout_ids=[p.rollout_id for p in members], task_ids=sorted({p.task_id for p in members}),
            mean_reward=sum(rewards) / len(rewards) if rewards else None,
            step_limit_hits=sum(p.signals.step_limit_hit for p in members), example=members[0],
        ))
    return clusters


def packet_lines(extraction: Extraction) -> list[str]:
    """Each packet as one line of canonical JSON (what ``write_jsonl`` writes)."""
    return [canonical_json(p.model_dump(mode="json")) for p in extraction.packets]


def write_jsonl(extraction: Extraction, path: str | Path) -> None:
    """Write the packets to ``path``, one per line, atomically (a reader never sees half a file)."""
    target = Path(path)
    partial = target.with_name(f".{target.name}.partial")
    partial.write_text("".join(line + "\n" for line in packet_lines(extraction)), encoding="utf-8")
    os.replace(partial, target)


def append_packets(lake: Lake, extraction: Extraction) -> int | None:
    """Append the extraction to ``failure_packets`` once; returns the new version, None if already stored.

    The commit carries the transaction marker ``trajlake-failures/<extraction_id>``:
    a rerun on the same inputs finds it and writes nothing.
    """
    app_id = f"trajlake-failures/{extraction.extraction_id}"
    if lake.marker(FAILURE_PACKETS_TABLE, app_id) is not None:
        return None
    now = datetime.now(timezone.utc)
    rows = [_row(extraction.extraction_id, packet, line, now)
            for packet, line in zip(extraction.packets, packet_lines(extraction))]
    return lake.append(FAILURE_PACKETS_TABLE, pa.Table.from_pylist(rows, schema=FAILURE_PACKETS), markers={app_id: 0},
                       schema=FAILURE_PACKETS)


def _row(extraction_id: str, packet: RolloutPacket | ClusterPacket, line: str, now: datetime) -> dict:
    sig = packet.signature
    is_rollout = isinstance(packet, RolloutPacket)
    return {
        "extraction_id": extraction_id, "packet_id": packet.packet_id, "kind": packet.kind,
        "harness_name": sig.harness.name, "harness_version": sig.harness.version,
        "harness_config_hash": sig.harness.config_hash, "status": sig.status, "failing_tool": sig.failing_tool,
        "error_signature": sig.error, "finish_reason": sig.finish_reason,
        "rollouts": 1 if is_rollout else packet.rollouts,
        "task_id": packet.task_id if is_rollout else None, "rollout_id": packet.rollout_id if is_rollout else None,
        "packet": line, "extracted_at": now,
    }
