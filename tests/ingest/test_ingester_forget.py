"""The ingester keeps exactly-once while ``store.forget`` deletes another tenant from the same tables.

Real broker, real Delta tables: forgets of tenant "zeta" run back to back
while the ingester commits small batches of "acme" and "zeta" events, so
appends keep meeting concurrent deletes (deltalake's CommitFailedError).
"""

import threading

from ingester_support import produce, stream

from ingest.ingester import IngesterConfig, IngestStats, ingest_until_idle, run_ingester
from schemas.tables import TYPED_TABLES
from store.forget import ForgetRequest, forget


def tenant_events(tenant: str, rollouts: int, seed: int) -> list[dict]:
    return [{**e, "tenant": tenant} for e in stream(rollouts, seed=seed)]


def test_forgetting_another_tenant_while_ingesting_loses_and_doubles_nothing(broker, topic, group, lake):
    kept, forgotten = tenant_events("acme", 40, seed=1), tenant_events("zeta", 40, seed=2)
    sent = [e for pair in zip(kept, forgotten) for e in pair]
    produce(broker.bootstrap_servers, topic, sent)
    config = IngesterConfig(lake=lake.root, bootstrap_servers=broker.bootstrap_servers, topic=topic, group=group,
                            partitions=(0, 1, 2, 3), batch_max_events=25)
    stop, outcome = threading.Event(), {}

    def until_all_consumed(stats: IngestStats) -> None:
        if stats.consumed >= len(sent):
            stop.set()

    def ingest() -> None:
        try:
            outcome["stats"] = run_ingester(config, stop, on_progress=until_all_consumed)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            outcome["error"] = exc
            stop.set()

    ingester = threading.Thread(target=ingest)
    ingester.start()
    forgets = gave_up = 0
    while ingester.is_alive() and forgets < 200:
        if lake.exists("events"):
            try:
                forget(lake, ForgetRequest(tenant="zeta"))
            except RuntimeError as exc:  # forget's own deletes lost to our appends 5 times: it says "run again"
                assert "run the forget again" in str(exc)
                gave_up += 1
            forgets += 1
    ingester.join(timeout=120)
    assert "error" not in outcome, f"the ingester failed: {outcome.get('error')!r}"
    stats = outcome["stats"]
    forget(lake, ForgetRequest(tenant="zeta"))  # what arrived after the last concurrent forget

    events = lake.read("events", columns=["event_id", "tenant"]).to_pylist()
    ids = [e["event_id"] for e in events]
    assert len(ids) == len(set(ids)), "an event was written twice"
    assert set(ids) == {e["event_id"] for e in kept}, "an acme event is missing (or a zeta one survived)"
    for event_type, (name, _) in TYPED_TABLES.items():
        rows = lake.read(name, columns=["event_id"]).column("event_id").to_pylist()
        assert sorted(rows) == sorted(e["event_id"] for e in kept if e["type"] == event_type), name
    assert stats.consumed == len(sent) and stats.conflicts == 0 and forgets >= 1
    print(f"forgets={forgets} gave_up={gave_up} commit_retries={stats.commit_retries} batches={stats.batches}")



def test_an_ingester_restarted_after_a_forget_checks_the_rewritten_files_and_carries_on(broker, topic, group, lake):
    """A forget rewrites files (delta-rs writes string_view); the next start checks the log against them."""
    kept, forgotten = tenant_events("acme", 4, seed=3), tenant_events("zeta", 4, seed=4)
    bad = [{"tenant": tenant, "rollout_id": "bad-1"} for tenant in ("acme", "zeta")]  # quarantined, one file
    produce(broker.bootstrap_servers, topic, [e for pair in zip(kept, forgotten) for e in pair] + bad)
    config = IngesterConfig(lake=lake.root, bootstrap_servers=broker.bootstrap_servers, topic=topic, group=group,
                            partitions=(0, 1, 2, 3))
    ingest_until_idle(config, idle_s=2)
    forget(lake, ForgetRequest(tenant="zeta"))
    assert lake.read("quarantine").num_rows == 1
    later = tenant_events("acme", 2, seed=5)
    produce(broker.bootstrap_servers, topic, later)
    stats = ingest_until_idle(config, idle_s=2)
    ids = lake.read("events", columns=["event_id"]).column("event_id").to_pylist()
    assert stats.events == len(later) and len(ids) == len(set(ids))
    assert set(ids) == {e["event_id"] for e in kept + later}
