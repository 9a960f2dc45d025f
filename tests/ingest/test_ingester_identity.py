"""Identities: dedupe is per (tenant, event_id); a Kafka key that is not the rollout id is stored and counted."""

import json

from ingester_support import produce, stream

from ingest.ingester import IngesterConfig, ingest_until_idle


def config(broker, topic, group, lake) -> IngesterConfig:
    return IngesterConfig(lake=lake.root, bootstrap_servers=broker.bootstrap_servers, topic=topic, group=group,
                          partitions=(0, 1, 2, 3))


def test_a_tenant_sending_another_tenants_event_ids_first_cannot_drop_its_events(broker, topic, group, lake):
    victim = [{**e, "tenant": "victim"} for e in stream(5, seed=51)]
    squatter = [{**e, "tenant": "squatter"} for e in stream(5, seed=52)]
    squatter = [{**s, "event_id": v["event_id"]} for s, v in zip(squatter, victim)]  # same ids, sent first
    produce(broker.bootstrap_servers, topic, squatter)
    produce(broker.bootstrap_servers, topic, victim)
    stats = ingest_until_idle(config(broker, topic, group, lake), idle_s=1.5)
    assert stats.duplicates == 0 and stats.events == len(victim) + len(squatter)

    rows = lake.read("events", columns=["tenant", "event_id"]).to_pylist()
    assert sorted(r["event_id"] for r in rows if r["tenant"] == "victim") == sorted(e["event_id"] for e in victim)
    requests = lake.read("llm_requests", columns=["tenant", "event_id"]).to_pylist()
    assert sum(r["tenant"] == "victim" for r in requests) == sum(e["type"] == "llm.request" for e in victim)

    produce(broker.bootstrap_servers, topic, victim[:3])  # a real retry of the victim's is still a duplicate
    again = ingest_until_idle(config(broker, topic, group, lake), idle_s=1.5)
    assert (again.events, again.duplicates) == (0, 3)


def test_events_whose_kafka_key_is_null_or_not_their_rollout_id_are_stored_and_counted(broker, topic, group, lake):
    keyed = list(stream(2, seed=53))
    unkeyed, mis_keyed = list(stream(1, seed=54)), list(stream(1, seed=55))
    produce(broker.bootstrap_servers, topic, keyed)
    produce(broker.bootstrap_servers, topic, [json.dumps(e).encode() for e in unkeyed])  # key null
    produce(broker.bootstrap_servers, topic, [json.dumps(e).encode() for e in mis_keyed], key=b"not-the-rollout")
    stats = ingest_until_idle(config(broker, topic, group, lake), idle_s=1.5)
    assert stats.key_mismatches == len(unkeyed) + len(mis_keyed)
    assert stats.events == len(keyed) + len(unkeyed) + len(mis_keyed) and stats.quarantined == 0
