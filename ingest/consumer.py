"""The Kafka side of the ingester: a consumer with auto-commit off, and its assignment.

Offsets live in the Delta log, never in Kafka. With a consumer group the
rebalance callbacks only raise a flag (no I/O inside kafka-python's poll);
the loop then re-reads the Delta markers and seeks. The consumer never moves
its own position: ``auto_offset_reset="none"`` turns an out-of-range fetch into
an error the loop handles (``ingest.log_check``), where "earliest" would jump
silently past or back over data. In static mode
(``partitions=[0, 1]``) the consumer assigns itself the partitions, without
a group: the right mode for kill tests and for pinning work by hand.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from kafka import ConsumerRebalanceListener, KafkaConsumer, TopicPartition
from kafka.errors import KafkaError
from kafka.structs import OffsetAndMetadata

from schemas.errors import BrokerUnreachable

log = logging.getLogger(__name__)

FETCH_MAX_WAIT_MS = 2_000
"""How long the broker may work on a fetch. tansu on ``s3://`` answers only what it read from the object
store within this wait and starts over on the next fetch: at 100 ms it never served a record of a 300-batch
partition in 40 s, at 500 ms 4.7 records/s, at 2,000 ms 70/s (same machine). A broker holding the records
answers at once whatever the wait (tansu ``memory://``: 11-17 ms median either way)."""


class AssignmentFlag(ConsumerRebalanceListener):
    """Set when partitions were revoked or assigned; the loop reacts after poll returns."""

    def __init__(self) -> None:
        self._changed = threading.Event()

    def on_partitions_revoked(self, revoked) -> None:
        self._changed.set()

    def on_partitions_assigned(self, assigned) -> None:
        self._changed.set()

    def raise_(self) -> None:
        self._changed.set()

    def take(self) -> bool:
        """True once per change."""
        changed = self._changed.is_set()
        self._changed.clear()
        return changed


def open_consumer(
    bootstrap_servers: str,
    topic: str,
    *,
    group: str | None,
    partitions: Sequence[int] | None,
    flag: AssignmentFlag,
    session_timeout_ms: int = 6000,
    heartbeat_interval_ms: int = 2000,
    max_partition_fetch_bytes: int = 8 * 1024 * 1024,
    bootstrap_timeout_ms: int = 30_000,
) -> KafkaConsumer:
    """A consumer subscribed with ``group`` or, when ``partitions`` is given, statically assigned."""
    try:
        with quiet_client_logs():
            consumer = _consumer(bootstrap_servers, group=None if partitions is not None else group,
                                 session_timeout_ms=session_timeout_ms,
                                 heartbeat_interval_ms=heartbeat_interval_ms,
                                 max_partition_fetch_bytes=max_partition_fetch_bytes,
                                 bootstrap_timeout_ms=bootstrap_timeout_ms)
    except KafkaError:
        raise BrokerUnreachable(bootstrap_servers) from None
    if partitions is not None:
        consumer.assign([TopicPartition(topic, p) for p in partitions])
        flag.raise_()
    else:
        consumer.subscribe([topic], listener=flag)
    return consumer


def _consumer(bootstrap_servers: str, *, group: str | None, session_timeout_ms: int, heartbeat_interval_ms: int,
              max_partition_fetch_bytes: int, bootstrap_timeout_ms: int) -> KafkaConsumer:
    return KafkaConsumer(
        bootstrap_servers=bootstrap_servers,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="none",
        session_timeout_ms=session_timeout_ms,
        heartbeat_interval_ms=heartbeat_interval_ms,
        max_partition_fetch_bytes=max_partition_fetch_bytes,
        fetch_max_bytes=64 * 1024 * 1024,
        fetch_max_wait_ms=FETCH_MAX_WAIT_MS,
        bootstrap_timeout_ms=bootstrap_timeout_ms,
    )


@contextmanager
def quiet_client_logs() -> Iterator[None]:
    """Keep kafka-python's own connection warnings (about 20 lines per failed bootstrap) off the terminal:
    a failed bootstrap becomes one ``BrokerUnreachable`` line. They stay visible at DEBUG."""
    client = logging.getLogger("kafka")
    if client.isEnabledFor(logging.DEBUG):
        yield
        return
    level = client.level
    client.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        client.setLevel(level)


def seek(consumer: KafkaConsumer, topic: str, resume: dict[int, int | None]) -> None:
    """Position each partition where the Delta log says (None: from the beginning)."""
    for p, offset in resume.items():
        tp = TopicPartition(topic, p)
        if offset is None:
            consumer.seek_to_beginning(tp)
        else:
            consumer.seek(tp, offset)


def report_progress(consumer: KafkaConsumer, topic: str, last_offsets: dict[int, int]) -> None:
    """Commit offsets to the group for monitoring (lag dashboards) only; never read back as truth."""
    if consumer.config.get("group_id") is None or not last_offsets:
        return
    offsets = {TopicPartition(topic, p): OffsetAndMetadata(o + 1, "", -1) for p, o in last_offsets.items()}
    try:
        consumer.commit(offsets)
    except KafkaError as exc:  # a rebalance in flight; the Delta log already has the truth
        log.debug("kafka offset commit skipped error=%s", exc)
