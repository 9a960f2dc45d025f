"""``LakeRecords`` (what the lake holds of the log) reads files that forget and retention rewrote.

delta-rs writes ``string_view`` columns when a DELETE rewrites a file; the log check, the replay
check and ``--recover`` compare the log with those files after any forget.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pyarrow as pa

from ingest.dedupe import SeenEventIds
from ingest.held import LakeRecords
from schemas.tables import EVENTS_TABLE, QUARANTINE, QUARANTINE_TABLE
from store.forget import ForgetRequest, forget
from store.lake import Lake
from tests.ingest.ingester_support import wire_event
from tests.store.lake_builder import sample_rollout, write_events

TOPIC = "trajlake.events"


def quarantined(offsets: dict[int, str]) -> pa.Table:
    """Rejected messages (offset -> tenant), one file."""
    return pa.Table.from_pylist([{
        "raw": json.dumps({"tenant": tenant}).encode(), "reason": "no event_id", "field": "event_id", "event_id": None,
        "kafka_key": None, "kafka_topic": TOPIC, "kafka_partition": 0, "kafka_offset": offset,
        "quarantined_at": datetime(2026, 1, 1, tzinfo=timezone.utc)} for offset, tenant in offsets.items()],
        schema=QUARANTINE)


def test_what_the_lake_holds_is_read_from_files_a_forget_rewrote(lake: Lake) -> None:
    events = sample_rollout("a1", tenant="acme") + sample_rollout("b1", tenant="bravo")
    write_events(lake, events)  # partition 0, offsets 0..21
    lake.append(QUARANTINE_TABLE, quarantined({30: "acme", 31: "bravo"}), schema=QUARANTINE)
    forget(lake, ForgetRequest(tenant="bravo", reason="test"))
    for table in (EVENTS_TABLE, QUARANTINE_TABLE):
        assert "string_view" in {str(f.physical_schema.field("kafka_topic").type)
                                 for f in lake.dataset(table).get_fragments()}, table

    records = LakeRecords(lake, topic=TOPIC, seen=SeenEventIds(), max_event_bytes=1_000_000)
    records.load({0: 0}, rewound_ms={})
    acme = [(e.tenant, e.event_id) for e in events if e.tenant == "acme"]
    assert records.stored_keys([*acme, ("bravo", events[-1].event_id)]) == set(acme)
    assert records.quarantined(0, 30) and not records.quarantined(0, 29)
    at_zero = wire_event("rollout.started", {"policy_version": "p7"}, rollout="a1", seq=0, event_id=events[0].event_id)
    assert records.has_at(0, 0, json.dumps(at_zero).encode())
    assert not records.has_at(0, 0, json.dumps({**at_zero, "event_id": "another"}).encode())


def test_a_rejected_message_that_only_its_key_names_counts_as_forgotten(lake: Lake) -> None:
    """``forget --rollout R`` deletes a quarantined message that is not JSON by its Kafka key; sitting at a marker,
    the next start's log check must see it as forgotten (not as a log that went backwards: exit 3)."""
    write_events(lake, sample_rollout("a1", tenant="acme"))
    not_json = pa.Table.from_pylist([{
        "raw": b"\xff not json", "reason": "not JSON", "field": "", "event_id": None, "kafka_key": b"r9",
        "kafka_topic": TOPIC, "kafka_partition": 0, "kafka_offset": 40,
        "quarantined_at": datetime(2026, 1, 1, tzinfo=timezone.utc)}], schema=QUARANTINE)
    lake.append(QUARANTINE_TABLE, not_json, schema=QUARANTINE)
    forget(lake, ForgetRequest(rollouts=("r9",), reason="test"))
    assert lake.read(QUARANTINE_TABLE).num_rows == 0

    records = LakeRecords(lake, topic=TOPIC, seen=SeenEventIds(), max_event_bytes=1_000_000)
    records.load({0: 40}, rewound_ms={})
    assert records.has_at(0, 40, b"\xff not json", b"r9")
    assert not records.has_at(0, 40, b"\xff not json", b"r8") and not records.has_at(0, 40, b"\xff not json")
