import threading

import pyarrow as pa
import pytest

from schemas.tables import EVENTS, TYPED_TABLES
from schemas.versions import validate_event
from store.commit import MarkedTable, marker_app_id
from store.event_rows import KafkaCoordinates, events_table, typed_tables
from store.lake import TableMissing
from store.rebuild import RebuildRaced, rebuild_typed_tables

GROUP, TOPIC = "g", "t"


def events(n: int, partition: int = 0):
    evs = []
    for i in range(n):
        kind = ["rollout.started", "llm.request", "llm.response", "reward"][i % 4]
        payload = {
            "rollout.started": {},
            "llm.request": {"call_id": f"c{i}", "prompt_token_ids": list(range(i, i + 5))},
            "llm.response": {"call_id": f"c{i}", "response_token_ids": [i], "logprobs": [-0.5], "token_source": "engine"},
            "reward": {"name": "r", "value": float(i)},
        }[kind]
        evs.append(validate_event({"event_id": f"e{partition}-{i}", "type": kind, "schema_version": 1,
                                   "ts": "2026-01-01T00:00:00Z", "task_id": "task", "rollout_id": f"r{i // 4}",
                                   "seq": i % 4, "payload": payload}))
    return events_table(evs, [KafkaCoordinates(TOPIC, partition, i) for i in range(n)])


def ingest_events_only(lake, rows, last):
    """What a crash after the events commit and before the typed commits leaves behind."""
    MarkedTable(lake, "events", EVENTS, group=GROUP, topic=TOPIC).commit(rows, last, refresh_offsets=0)


def sorted_rows(lake, name):
    return lake.read(name).sort_by([("kafka_partition", "ascending"), ("kafka_offset", "ascending")])


def test_rebuild_derives_typed_tables_and_carries_markers(lake):
    rows = events(40)
    ingest_events_only(lake, rows, {0: 39})
    counts = rebuild_typed_tables(lake, group=GROUP)
    expected = typed_tables(rows)
    assert counts == {name: expected[name].num_rows if name in expected else 0 for name, _ in TYPED_TABLES.values()}
    for name, table in expected.items():
        assert sorted_rows(lake, name).equals(table)
        assert lake.marker(name, marker_app_id(GROUP, TOPIC, 0)) == 39
    assert lake.read("rollout_ends").num_rows == 0


def test_rebuild_overwrites_in_one_version_and_is_repeatable(lake):
    ingest_events_only(lake, events(12), {0: 11})
    ingest_events_only(lake, events(8, partition=1), {1: 7})
    rebuild_typed_tables(lake, group=GROUP)
    first = {name: sorted_rows(lake, name) for name, _ in TYPED_TABLES.values()}
    versions = {name: lake.version(name) for name in first}
    rebuild_typed_tables(lake, group=GROUP)
    for name, table in first.items():
        assert sorted_rows(lake, name).equals(table)
        assert lake.version(name) == versions[name] + 1
    assert lake.read("llm_requests").num_rows == 3 + 2


def test_rebuild_reports_progress(lake):
    ingest_events_only(lake, events(8), {0: 7})
    seen = []
    rebuild_typed_tables(lake, group=GROUP, progress=lambda name, rows: seen.append((name, rows)))
    assert ("llm_requests", 2) in seen and ("rewards", 2) in seen


def test_rebuild_without_events_says_what_to_do(lake):
    with pytest.raises(TableMissing, match="trajlake ingest"):
        rebuild_typed_tables(lake)


def test_rebuild_detects_a_concurrent_writer(lake):
    ingest_events_only(lake, events(8), {0: 7})
    more = events(12)

    def ingester_commits_meanwhile(name, rows):
        if name == "rollout_starts":  # from another thread, as another process would
            writer = threading.Thread(target=lambda: lake.append(
                "events", more.slice(8), markers={marker_app_id(GROUP, TOPIC, 0): 11}))
            writer.start()
            writer.join()

    with pytest.raises(RebuildRaced, match="stop the ingesters"):
        rebuild_typed_tables(lake, group=GROUP, progress=ingester_commits_meanwhile)


def test_rebuild_keeps_two_tenants_events_that_share_event_ids(lake):
    """Ids are scoped to their tenant (issue 11): another tenant's copy of an id is its own event."""
    acme = events(8)
    beta = events(8, partition=1)
    beta = beta.set_column(beta.schema.get_field_index("event_id"), "event_id", acme.column("event_id"))
    beta = beta.set_column(beta.schema.get_field_index("tenant"), "tenant", pa.array(["beta"] * 8, pa.string()))
    ingest_events_only(lake, acme, {0: 7})
    ingest_events_only(lake, beta, {1: 7})
    rebuild_typed_tables(lake, group=GROUP)
    requests = lake.read("llm_requests", columns=["tenant", "event_id"]).to_pylist()
    assert sorted((r["tenant"], r["event_id"]) for r in requests) == [
        ("beta", "e0-1"), ("beta", "e0-5"), ("default", "e0-1"), ("default", "e0-5")]
