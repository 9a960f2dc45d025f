"""Forget and retention on real Delta tables: rows and their Parquet files gone, the rest kept, audited."""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from deltalake import write_deltalake

from schemas.events import EVENT_ADAPTER
from schemas.tables import FORGET_AUDIT_TABLE, INGESTED_TABLES, QUARANTINE, SAMPLES
from store.compact import compact
from store.event_rows import KafkaCoordinates, Rejected, events_table, quarantine_table, typed_tables
from store.forget import ForgetRequest, forget, forgotten_dataset_versions
from store.lake import Lake
from store.retention import RetentionPolicy, apply_retention, expired_rollouts

T0 = datetime(2026, 11, 1, tzinfo=timezone.utc)
LINEAGE = pa.schema([("dataset", pa.string()), ("version", pa.int64()), ("rollout_id", pa.string())])


def secret(tenant: str, rollout: str) -> str:
    """A string only this rollout's rows contain (in the prompt, tool result and raw quarantine bytes)."""
    return f"SECRET-{tenant}-{rollout}-7f3a"


def rollout_events(tenant: str, rollout: str, *, user: str | None = None, at: datetime = T0) -> list:
    envelope = {"tenant": tenant, "task_id": "task-1", "rollout_id": rollout, "schema_version": 1}
    payloads = [
        ("rollout.started", {"policy_version": "p1", "metadata": {"user": user} if user else {}}),
        ("llm.request", {"call_id": "c1", "model": "m", "messages": [{"role": "user", "content": secret(tenant, rollout)}],
                         "prompt_token_ids": [1, 2, 3]}),
        ("llm.response", {"call_id": "c1", "text": "ok", "response_token_ids": [4], "logprobs": [-0.1],
                          "token_source": "engine"}),
        ("tool.call", {"call_id": "t1", "name": "bash", "arguments": {"cmd": "ls"}}),
        ("tool.result", {"call_id": "t1", "name": "bash", "result": secret(tenant, rollout)}),
        ("rollout.finished", {"status": "succeeded"}),
        ("reward", {"name": "pass", "value": 1.0}),
    ]
    return [
        EVENT_ADAPTER.validate_python({**envelope, "event_id": uuid.uuid4().hex, "type": kind, "seq": seq,
                                       "ts": at + timedelta(seconds=seq), "payload": payload})
        for seq, (kind, payload) in enumerate(payloads)
    ]


def ingest(lake: Lake, events: list, *, first_offset: int = 0) -> None:
    """Append like the ingester does: events + typed tables from the same rows."""
    rows = events_table(events, [KafkaCoordinates("trajlake.events", 0, first_offset + i) for i in range(len(events))])
    lake.append("events", rows, schema=INGESTED_TABLES["events"])
    for name, typed in typed_tables(rows).items():
        lake.append(name, typed, schema=INGESTED_TABLES[name])


def quarantine(lake: Lake, tenant: str, rollout: str, offset: int) -> None:
    raw = json.dumps({"tenant": tenant, "rollout_id": rollout, "type": "llm.request", "note": secret(tenant, rollout)})
    rejected = Rejected(raw=raw.encode(), field="payload", reason="bad", key=rollout.encode(),
                        coordinates=KafkaCoordinates("trajlake.events", 1, offset))
    lake.append("quarantine", quarantine_table([rejected]), schema=QUARANTINE)


def dataset(lake: Lake, rollouts: list[tuple[str, str]]) -> None:
    """Two versions of ``datasets/nightly`` (each build overwrites) with lineage rows."""
    for version in (0, 1):
        rows = [
            {"sample_id": f"{r}-{version}", "tenant": t, "task_id": "task-1", "rollout_id": r, "group_id": "task-1",
             "sample_index": 0, "start_reason": "first", "call_ids": ["c1"], "input_ids": [1, 2], "loss_mask": [0, 1],
             "old_logprobs": [0.0, -0.1], "advantage": 0.5, "token_weight": 0.5, "reward": 1.0, "n_tokens": 2,
             "n_trained_tokens": 1, "policy_version": secret(t, r), "tokenizer": "tok"}
            for t, r in rollouts
        ]
        write_deltalake(lake.uri("datasets/nightly"), pa.Table.from_pylist(rows, schema=SAMPLES), mode="overwrite")
        lineage = [{"dataset": "nightly", "version": version, "rollout_id": r} for _, r in rollouts]
        lake.append("dataset_lineage", pa.Table.from_pylist(lineage, schema=LINEAGE))


@pytest.fixture
def full_lake(lake: Lake) -> Lake:
    """Tenants acme (r1 by user u1, r2 by u2) and zeta (z1 by user u1), quarantine rows, a dataset."""
    ingest(lake, rollout_events("acme", "r1", user="u1"))
    ingest(lake, rollout_events("acme", "r2", user="u2"), first_offset=100)
    ingest(lake, rollout_events("zeta", "z1", user="u1"), first_offset=200)
    for offset, (tenant, rollout) in enumerate([("acme", "r1"), ("zeta", "z1")]):
        quarantine(lake, tenant, rollout, offset)
    dataset(lake, [("acme", "r1"), ("acme", "r2"), ("zeta", "z1")])
    return lake


def stored_text(lake: Lake) -> str:
    """Every file under the lake: Parquet decoded (compression hides nothing), the log's JSON as text."""
    parts = []
    for path in Path(lake.root).rglob("*"):
        if path.suffix == ".parquet":
            parts.append(str(pq.read_table(path).to_pylist()))
        elif path.is_file():
            parts.append(path.read_bytes().decode("utf-8", "replace"))
    return "\n".join(parts)


def rollouts_in(lake: Lake, table: str) -> set[str]:
    return set(lake.read(table, columns=["rollout_id"])["rollout_id"].to_pylist())


def test_forget_tenant_removes_rows_and_files_and_keeps_other_tenants(full_lake: Lake) -> None:
    lake = full_lake
    assert secret("acme", "r1") in stored_text(lake)  # the check below can see a secret
    report = forget(lake, ForgetRequest(tenant="acme", reason="ticket-42"))

    assert report.rollouts == ("r1", "r2")
    for table in [*INGESTED_TABLES.keys() - {"quarantine"}, "datasets/nightly", "dataset_lineage"]:
        assert rollouts_in(lake, table) == {"z1"}, table
    assert lake.read("quarantine")["kafka_key"].to_pylist() == [b"z1"]
    text = stored_text(lake)
    assert secret("acme", "r1") not in text and secret("acme", "r2") not in text
    assert secret("zeta", "z1") in text
    assert {t.table for t in report.tables if t.rows_deleted and t.files_vacuumed} >= {"events", "llm_requests", "quarantine"}


def test_forget_rollout_leaves_the_tenants_other_rollouts(full_lake: Lake) -> None:
    report = forget(full_lake, ForgetRequest(rollouts=("r1",)))
    assert rollouts_in(full_lake, "events") == {"r2", "z1"}
    assert rollouts_in(full_lake, "datasets/nightly") == {"r2", "z1"}
    assert full_lake.read("quarantine")["kafka_key"].to_pylist() == [b"z1"]
    assert secret("acme", "r1") not in stored_text(full_lake) and secret("acme", "r2") in stored_text(full_lake)
    assert report.rows_deleted == 7 * 2 + 1 + 1 + 2  # events + typed tables, quarantine, dataset (latest), lineage


def test_files_forget_rewrites_keep_token_ids_plain_and_scalars_in_dictionaries(full_lake: Lake) -> None:
    """A delete rewrites the files that held the rollout with the compaction's settings, not delta-rs's default
    (dictionary pages everywhere, which made token columns larger)."""
    compact(full_lake, tables=["events"])  # one file holds every rollout: the delete must rewrite it
    before = {p.name for p in Path(full_lake.uri("events")).glob("*.parquet")}
    forget(full_lake, ForgetRequest(rollouts=("r1",)))
    rewritten = [p for p in Path(full_lake.uri("events")).glob("*.parquet") if p.name not in before]
    assert rewritten
    for path in rewritten:
        meta = pq.ParquetFile(path).metadata
        chunks = {meta.row_group(0).column(c).path_in_schema: meta.row_group(0).column(c)
                  for c in range(meta.num_columns)}
        token_ids, rollout_id = chunks["token_ids.list.element"], chunks["rollout_id"]
        assert token_ids.compression == rollout_id.compression == "ZSTD"
        assert not token_ids.has_dictionary_page and "RLE_DICTIONARY" not in token_ids.encodings
        assert rollout_id.has_dictionary_page


def test_forget_user_is_scoped_to_its_tenant(full_lake: Lake) -> None:
    report = forget(full_lake, ForgetRequest(tenant="acme", user="u1"))
    assert report.rollouts == ("r1",)
    assert rollouts_in(full_lake, "rollout_starts") == {"r2", "z1"}  # zeta's u1 is another person


def test_forget_keeps_the_ingesters_exactly_once_markers(full_lake: Lake) -> None:
    full_lake.append("events", full_lake.read("events").slice(0, 0), markers={"ingester:g:t:0": 299})
    forget(full_lake, ForgetRequest(tenant="acme"))
    assert full_lake.marker("events", "ingester:g:t:0") == 299


def test_forget_while_the_ingester_appends_loses_none_of_the_other_rows(full_lake: Lake) -> None:
    import threading

    from deltalake.exceptions import CommitFailedError, DeltaError

    app_id = "ingester:g:trajlake.events:0"
    appended: list[int] = []

    def retried(append: Callable[[], object], offset: int) -> None:
        """delta-rs fails an append that overlaps a delete; nothing was committed, so commit again. An append
        can also commit and then fail re-reading a log file forget's cleanup just removed: the marker says
        which, as it tells the ingester when it restarts."""
        for _ in range(20):
            try:
                append()
                return
            except CommitFailedError:
                continue
            except DeltaError:
                if full_lake.marker("events", app_id) == offset:
                    return
        raise AssertionError("append kept conflicting")

    def ingester() -> None:
        for i in range(12):
            offset = 1000 + 10 * i
            rows = events_table(rollout_events("zeta", f"z-live-{i}"),
                                [KafkaCoordinates("trajlake.events", 0, offset + k) for k in range(7)])
            retried(lambda: full_lake.append("events", rows, markers={app_id: offset}), offset)
            appended.append(offset)

    thread = threading.Thread(target=ingester)
    thread.start()
    forget(full_lake, ForgetRequest(tenant="acme"))
    thread.join()
    assert rollouts_in(full_lake, "events") == {"z1", *(f"z-live-{i}" for i in range(12))}
    assert rollouts_in(full_lake, "llm_requests") == {"z1"}
    assert full_lake.read("events").num_rows == 7 * 13
    assert full_lake.marker("events", app_id) == appended[-1]
    assert secret("acme", "r1") not in stored_text(full_lake)


def test_forget_rollout_inside_another_tenant_deletes_nothing(full_lake: Lake) -> None:
    report = forget(full_lake, ForgetRequest(tenant="zeta", rollouts=("r1",)))
    assert report.rows_deleted == 0 and rollouts_in(full_lake, "events") == {"r1", "r2", "z1"}


def test_datasets_with_forgotten_rows_are_marked_and_audited(full_lake: Lake) -> None:
    report = forget(full_lake, ForgetRequest(tenant="acme", user="u2", reason="gdpr-7"))
    assert report.marked_datasets == {"datasets/nightly": (0, 1)}
    assert forgotten_dataset_versions(full_lake) == {"nightly": {0, 1}}
    audit = full_lake.read(FORGET_AUDIT_TABLE).to_pylist()
    assert {row["forget_id"] for row in audit} == {report.forget_id}
    assert {row["kind"] for row in audit} == {"forget"} and {row["reason"] for row in audit} == {"gdpr-7"}
    assert audit[0]["user_sha256"] == hashlib.sha256(b"u2").hexdigest()
    assert "u2" not in str(audit).replace(hashlib.sha256(b"u2").hexdigest(), "")
    assert {row["table"] for row in audit} >= {"events", "datasets/nightly", "quarantine", "dataset_lineage"}


def test_forget_purges_older_dataset_versions_that_used_the_rollout(lake: Lake) -> None:
    ingest(lake, rollout_events("acme", "r1"))
    ingest(lake, rollout_events("acme", "r2"), first_offset=50)
    dataset(lake, [("acme", "r1"), ("acme", "r2")])
    dataset(lake, [("acme", "r2")])  # versions 2 and 3 no longer hold r1
    assert secret("acme", "r1") in stored_text(lake)
    report = forget(lake, ForgetRequest(rollouts=("r1",)))
    assert report.marked_datasets == {"datasets/nightly": (0, 1)}
    assert secret("acme", "r1") not in stored_text(lake)
    assert rollouts_in(lake, "datasets/nightly") == {"r2"}


def test_forget_again_is_a_no_op_that_is_still_audited(full_lake: Lake) -> None:
    forget(full_lake, ForgetRequest(rollouts=("r2",)))
    again = forget(full_lake, ForgetRequest(rollouts=("r2",)))
    assert again.rows_deleted == 0 and again.marked_datasets == {}
    assert len({row["forget_id"] for row in full_lake.read(FORGET_AUDIT_TABLE).to_pylist()}) == 2


def test_forget_on_an_empty_lake_records_the_request(lake: Lake) -> None:
    report = forget(lake, ForgetRequest(tenant="nobody"))
    assert report.tables == [] and lake.read(FORGET_AUDIT_TABLE)["table"].to_pylist() == [""]


def test_forget_escapes_quotes_in_ids(lake: Lake) -> None:
    ingest(lake, rollout_events("o'brien", "r'1"))
    ingest(lake, rollout_events("other", "r2"), first_offset=50)
    forget(lake, ForgetRequest(rollouts=("r'1",)))
    assert rollouts_in(lake, "events") == {"r2"}


@pytest.mark.parametrize(
    ("request_args", "message"),
    [
        ({}, "say what to forget"),
        ({"user": "u1"}, "needs --tenant"),
        ({"tenant": ""}, "non-empty"),
        ({"tenant": 5}, "printable string"),
        ({"rollouts": ("ok", None)}, "printable string"),
        ({"tenant": "x" * 513}, "at most 512"),
        ({"tenant": "acme\x00"}, "printable"),
    ],
)
def test_forget_request_rejects_bad_input(request_args: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ForgetRequest(**request_args)


def test_retention_forgets_whole_rollouts_older_than_the_tenant_cutoff(lake: Lake) -> None:
    now = T0 + timedelta(days=40)
    ingest(lake, rollout_events("acme", "old", at=T0))
    ingest(lake, rollout_events("acme", "new", at=now - timedelta(days=2)), first_offset=10)
    ingest(lake, rollout_events("zeta", "z-old", at=T0), first_offset=20)
    ingest(lake, rollout_events("keep", "k-old", at=T0), first_offset=30)
    policy = RetentionPolicy.parse({"acme": 30, "zeta": 60})
    assert expired_rollouts(lake, policy, now=now) == {"acme": ["old"]}

    [report] = apply_retention(lake, policy, clock=lambda: now)
    assert report.request.kind == "retention" and report.rollouts == ("old",)
    assert rollouts_in(lake, "events") == {"new", "z-old", "k-old"}
    reports = apply_retention(lake, RetentionPolicy.parse({"*": 30}), clock=lambda: now)
    assert [(r.request.tenant, r.rollouts) for r in reports] == [("keep", ("k-old",)), ("zeta", ("z-old",))]
    assert rollouts_in(lake, "events") == {"new"}
    kinds = pc.unique(lake.read(FORGET_AUDIT_TABLE)["kind"]).to_pylist()
    assert kinds == ["retention"]


def test_retention_policy_files(tmp_path: Path) -> None:
    (tmp_path / "p.json").write_text('{"acme": 7, "*": 90}')
    (tmp_path / "p.toml").write_text('[retention]\nacme = 7\n"*" = 90\n')
    assert RetentionPolicy.from_file(tmp_path / "p.json") == RetentionPolicy.from_file(tmp_path / "p.toml")
    assert RetentionPolicy.from_file(tmp_path / "p.json").days_for("zeta") == 90
    assert RetentionPolicy.parse({"acme": 7}).days_for("zeta") is None


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ([30], "must map tenant"),
        ({"acme": "30"}, "whole number"),
        ({"acme": 0}, "whole number"),
        ({"acme": True}, "whole number"),
        ({"acme": 10**9}, "whole number"),
        ({"": 5}, "non-empty"),
    ],
)
def test_retention_policy_rejects_bad_values(values: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RetentionPolicy.parse(values)


def test_retention_policy_file_that_is_not_json(tmp_path: Path) -> None:
    (tmp_path / "p.json").write_text("acme: 30")
    with pytest.raises(ValueError, match="not valid json"):
        RetentionPolicy.from_file(tmp_path / "p.json")


def run_cli(*args: str, env: dict | None = None, input: str | None = None):
    from typer.testing import CliRunner

    from trajlake.cli import build_app

    result = CliRunner().invoke(build_app(), list(args), env=env, input=input)
    return result.exit_code, " ".join(result.output.split())


def test_forget_cli_deletes_after_confirmation_and_names_datasets_to_rebuild(full_lake: Lake) -> None:
    from trainer.records import CheckpointRecord, write_checkpoint

    for version in (0, 1):
        write_checkpoint(full_lake, CheckpointRecord(
            checkpoint_id=f"ckpt-nightly-v{version}", dataset="nightly", dataset_version=version, base_model="tiny",
            parent_checkpoint_id=None, mode="pg", config={}, code_version="test", metrics={}, ds_path="ds",
            hf_path="hf", tokenizer="tok", world_size=1, n_samples=1, n_tokens=2, steps=1, created_at=T0))
    code, output = run_cli("forget", "--tenant", "acme", "--lake", full_lake.root, input="n\n")
    assert code == 1 and rollouts_in(full_lake, "events") == {"r1", "r2", "z1"}
    code, output = run_cli("forget", "--tenant", "acme", "--reason", "ticket-9", "--yes", "--lake", full_lake.root)
    assert code == 0, output
    assert "events" in output and "trajlake build-dataset nightly" in output
    assert "ckpt-nightly-v0, ckpt-nightly-v1" in output
    assert rollouts_in(full_lake, "events") == {"z1"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "say what to forget"),
        (["--user", "u1"], "needs --tenant"),
        (["--rollout", "x" * 600], "at most 512"),
    ],
)
def test_forget_cli_rejects_bad_requests(lake: Lake, args: list[str], message: str) -> None:
    code, output = run_cli("forget", "--yes", "--lake", lake.root, *args)
    assert code == 1 and message in output


def test_retention_cli_show_and_apply(lake: Lake, tmp_path: Path) -> None:
    ingest(lake, rollout_events("acme", "old", at=T0))
    policy = tmp_path / "retention.json"
    policy.write_text('{"acme": 1}')
    code, output = run_cli("retention", "show", "--policy", str(policy), "--lake", lake.root)
    assert code == 0 and "acme 1 1" in output.replace("│", " ").replace("  ", " ")
    code, output = run_cli("retention", "apply", "--lake", lake.root, env={"TRAJLAKE_RETENTION_DAYS": '{"acme": 1}'})
    assert code == 0 and "1 expired rollouts of tenant acme" in output
    assert not lake.read("events").num_rows


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"TRAJLAKE_RETENTION_DAYS": "not json"}, "JSON object"),
        ({"TRAJLAKE_RETENTION_DAYS": '{"acme": -1}'}, "whole number"),
    ],
)
def test_retention_cli_reports_bad_policies(lake: Lake, env: dict, message: str) -> None:
    code, output = run_cli("retention", "apply", "--lake", lake.root, env=env)
    assert code == 2 and message in output, output  # bad settings: nothing was started


def test_topic_retention_says_when_raw_events_go_or_why_it_cannot_tell() -> None:
    from types import SimpleNamespace

    from devkit.ports import free_port
    from ingest.topic_retention import TopicRetention, _parse, topic_retention

    week = TopicRetention("events", 7 * 24 * 3600 * 1000)
    assert week.dropped_by(T0) == T0 + timedelta(days=7)
    assert TopicRetention("events", -1).dropped_by(T0) is None
    answer = SimpleNamespace(resources=[(0, None, 2, "events", [("retention.ms", "86400000", False, False, False)])])
    assert _parse("events", [answer]).retention_ms == 86_400_000
    refused = SimpleNamespace(resources=[(29, "not authorised", 2, "events", [])])
    assert _parse("events", [refused]).reason == "the broker refused DescribeConfigs: not authorised"
    nobody = topic_retention(f"127.0.0.1:{free_port()}", "events", timeout_s=1)
    assert nobody.retention_ms is None and "no broker answered" in nobody.reason
