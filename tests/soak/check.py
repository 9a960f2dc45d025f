"""Reading what the soak left: the topic read back whole, the lake's Delta tables read directly.

Delta tables are read with deltalake's DataFusion ``QueryBuilder`` (not trajlake's views, and not the
PyArrow dataset route, which can abort the process at exit: see the lake notes).
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from ingest.consumer import FETCH_MAX_WAIT_MS
from store.commit import marker_app_id
from store.lake import Lake

Message = tuple[int, int, "str | None"]
"""(partition, offset, event_id) of one message in the topic."""


def events_markers(lake: Lake, group: str, topic: str, partitions) -> dict[int, int | None]:
    """The ``events`` table's transaction markers: the last offset it is complete through, per partition."""
    from deltalake import DeltaTable

    try:
        dt = DeltaTable(lake.uri("events"), storage_options=dict(lake.storage_options))
    except Exception:  # noqa: BLE001 - not created yet, or the store is frozen for a moment
        return {}
    return {p: dt.transaction_version(marker_app_id(group, topic, p)) for p in partitions}


def stored_keys(lake: Lake) -> set[str]:
    """Idempotency keys whose call has its row in both typed tables (``llm_requests``, ``llm_responses``)."""
    try:
        requests = query(lake, "llm_requests", "SELECT idempotency_key, call_id FROM llm_requests")
        responded = set(query(lake, "llm_responses", "SELECT call_id FROM llm_responses")["call_id"])
    except Exception:  # noqa: BLE001 - tables not created yet, or the store is slow: just not there yet
        return set()
    return {k for k, c in zip(requests["idempotency_key"], requests["call_id"]) if c in responded}


# ---------------------------------------------------------------- the check


def query(lake: Lake, table: str, sql: str) -> dict[str, list]:
    """Run ``sql`` against one Delta table (DataFusion via deltalake; no PyArrow dataset, no abort at exit)."""
    from deltalake import DeltaTable, QueryBuilder

    dt = DeltaTable(lake.uri(table), storage_options=dict(lake.storage_options))
    return pa.table(QueryBuilder().register(table, dt).execute(sql).read_all()).to_pydict()


@dataclass
class LogRead:
    """What the topic holds: every message, and the keyed calls whose request and response are in it."""

    messages: list[Message] = field(default_factory=list)
    call_of: dict[str, str] = field(default_factory=dict)
    """Idempotency key -> call id, from the ``llm.request`` events."""
    responded: set[str] = field(default_factory=set)
    """Call ids with an ``llm.response`` event."""

    @property
    def complete(self) -> set[str]:
        return {key for key, call in self.call_of.items() if call in self.responded}

    def add(self, partition: int, offset: int, value: bytes) -> None:
        try:
            event = json.loads(value)
            payload = event.get("payload") or {}
        except (ValueError, AttributeError):
            event, payload = {}, {}
        self.messages.append((partition, offset, event.get("event_id")))
        if event.get("type") == "llm.request" and payload.get("idempotency_key"):
            self.call_of[payload["idempotency_key"]] = payload.get("call_id")
        elif event.get("type") == "llm.response":
            self.responded.add(payload.get("call_id"))


def read_log(bootstrap_servers: str, topic: str, *, expect: set[str], quiet_s: float = 4.0,
             give_up_s: float = 300.0) -> LogRead:
    """Every message of ``topic``, read from the beginning.

    tansu's end offsets are wrong and, on ``s3://`` storage, a fetch can come back empty while records
    exist (see the broker notes and soak findings), so "the end" is: the request and response of every
    keyed call in ``expect`` seen, then no record for ``quiet_s``; or ``give_up_s`` passed (then some
    answered calls never reached the log).
    """
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap_servers, enable_auto_commit=False,
                             fetch_max_wait_ms=FETCH_MAX_WAIT_MS)  # what the ingesters use (see there)
    try:
        parts = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or [])]
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        log_read = LogRead()
        started = last = time.monotonic()
        waiting = True
        while time.monotonic() - started < give_up_s and (waiting or time.monotonic() - last < quiet_s):
            for tp, records in consumer.poll(timeout_ms=500).items():
                last = time.monotonic()
                for r in records:
                    log_read.add(tp.partition, r.offset, r.value)
            waiting = waiting and not expect <= log_read.complete
        return log_read
    finally:
        consumer.close()


def account_for_log(messages: list[Message], stored: dict[tuple[int, int], str],
                    quarantined: set[tuple[int, int]], markers: dict[int, int | None] | None = None) -> Counter[str]:
    """What became of each message: ``stored`` at its offset, ``duplicate`` of an event stored at an
    earlier offset (``stored_later``: at a later one), ``quarantined``, ``behind`` (past its partition's
    ``events`` marker: not ingested yet, the ingesters are behind the log), or ``unaccounted`` (at or below
    the marker and nowhere in the lake: dropped); ``moved``: a row whose offset holds another event in the
    log, or no message at all. Without ``markers`` every message nowhere in the lake is ``unaccounted``."""
    first_at = {}
    for (p, o), e in stored.items():
        first_at[e] = min(first_at.get(e, (p, o)), (p, o))
    out: Counter[str] = Counter()
    seen = set()
    for p, o, event_id in messages:
        seen.add((p, o))
        if (p, o) in stored:
            out["stored" if stored[(p, o)] == event_id else "moved"] += 1
        elif (p, o) in quarantined:
            out["quarantined"] += 1
        elif event_id in first_at:
            # a copy of a stored event; "stored_later": the first copy was passed over, a later one stored
            out["duplicate" if first_at[event_id] < (p, o) else "stored_later"] += 1
        elif markers is not None and o > (-1 if markers.get(p) is None else markers[p]):
            out["behind"] += 1
        else:
            out["unaccounted"] += 1
    out["moved"] += sum(1 for pos in stored if pos not in seen)  # a row at an offset the log does not have
    return out


_STOPPED = re.compile(r"ingester stopped (.*)$")


def stopped_stats(path: Path) -> Counter[str]:
    totals: Counter[str] = Counter()
    for line in path.read_text(errors="replace").splitlines():
        if m := _STOPPED.search(line):
            for k, v in re.findall(r"(\w+)=(\d+)", m.group(1)):
                totals[k] += int(v)
    return totals


def last_words(path: Path, *, chars: int = 600) -> str:
    """The end of what a process printed in its last run (after the harness's ``==== start`` line), on one
    line, DEBUG lines left out: an error message rich wrapped over several lines reads whole."""
    run = path.read_text(errors="replace").rsplit("\n==== start ", 1)[-1].splitlines()[1:]
    said = " ".join(line.strip() for line in run if line.strip() and " DEBUG " not in line)
    return said[-chars:] or "(printed nothing)"
